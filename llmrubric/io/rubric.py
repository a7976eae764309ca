"""Rubric YAML → question objects: the only place where answer scales are written."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from llmrubric.io.errors import InputError, yaml_error
from llmrubric.io.guards import did_you_mean

log = logging.getLogger(__name__)
RUBRIC_KEYS = ("name", "questions")
QUESTION_KEYS = ("id", "name", "prompt", "main", "applicable_if", "ordered", "options", "llm_options")
OPTION_KEYS = ("value", "label")
_warned: set[str] = set()  # the rubrics whose missing main question was reported (once per process)


def check_keys(data: dict, known: tuple[str, ...], where: str) -> None:
    """An error naming the first key of ``data`` that is not one of ``known``, and the key meant where one is close."""
    for key in data:
        if key not in known:
            raise InputError(
                f"{where}: unknown key {key!r}{did_you_mean(key, known)} (the keys are {', '.join(known)})"
            )


def option_key(value: Any) -> str:
    """Canonical string key of an option value: ``4``, ``4.0`` and ``"4"`` are all ``"4"``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        if float(value).is_integer():
            return str(int(value))
        return repr(float(value))
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return option_key(number) if math.isfinite(number) else text


@dataclass(frozen=True)
class Option:
    """One allowed answer: its value (numeric where the scale is numeric) and its label."""

    value: Any
    label: str

    @property
    def key(self) -> str:
        return option_key(self.value)

    @property
    def numeric(self) -> float | None:
        try:
            return float(self.value)
        except (TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Question:
    """A rubric question with its human answer options and the options offered to the LLM.

    ``ordered``: the options are points on a numeric scale (means, RMSE and correlations apply);
    otherwise they are categories (yes/no, topic labels) scored by accuracy, macro-F1, NLL
    and Brier score. In the YAML it defaults to whether every option value is a number.
    """

    id: str
    prompt: str
    options: tuple[Option, ...]
    llm_options: tuple[str, ...]
    name: str = ""
    main: bool = False
    applicable_if: str | None = None
    ordered: bool = True

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.options)

    @property
    def values(self) -> list[float]:
        """Numeric option values in order (for expected values); NaN where not numeric or not ``ordered``."""
        return [math.nan if o.numeric is None or not self.ordered else o.numeric for o in self.options]

    def index_of(self, answer: Any) -> int | None:
        """Position of ``answer`` (a value or a label) among the options, or None."""
        key = option_key(answer)
        for i, option in enumerate(self.options):
            if option.key == key or option.label == str(answer).strip():
                return i
        return None


@dataclass(frozen=True)
class Rubric:
    """An ordered set of questions; exactly one is the main question."""

    name: str
    questions: tuple[Question, ...]
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        ids = [q.id for q in self.questions]
        if len(set(ids)) != len(ids):
            raise InputError(f"{self.source}: duplicate question ids {sorted(i for i in ids if ids.count(i) > 1)}")
        if sum(q.main for q in self.questions) > 1:
            raise InputError(f"{self.source}: more than one question has main: true")

    @property
    def ids(self) -> list[str]:
        return [q.id for q in self.questions]

    @property
    def main(self) -> Question:
        for q in self.questions:
            if q.main:
                return q
        return self.questions[0]

    def __getitem__(self, question_id: str) -> Question:
        for q in self.questions:
            if q.id == question_id:
                return q
        raise KeyError(question_id)

    def __contains__(self, question_id: object) -> bool:
        return any(q.id == question_id for q in self.questions)

    def with_main(self, question_id: str) -> Rubric:
        """The same rubric with ``question_id`` as main question."""
        if question_id not in self:
            raise InputError(f"{self.source}: main question {question_id!r} is not in the rubric {self.ids}")
        qs = tuple(replace(q, main=q.id == question_id) for q in self.questions)
        return Rubric(self.name, qs, self.source)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "questions": [
                {
                    "id": q.id,
                    "name": q.name,
                    "prompt": q.prompt,
                    "main": q.main,
                    "applicable_if": q.applicable_if,
                    "ordered": q.ordered,
                    "options": [{"value": o.value, "label": o.label} for o in q.options],
                    "llm_options": list(q.llm_options),
                }
                for q in self.questions
            ],
        }

    @classmethod
    def from_dict(cls, data: dict, source: str = "<memory>", warn_main: bool = True) -> Rubric:
        """The rubric of a parsed YAML mapping; an unknown key is an error naming it (and the key meant).
        Without a question marked ``main: true`` the first is the main question, said once in a warning
        (``warn_main=False``: the caller names the main question itself)."""
        if not isinstance(data, dict) or not data.get("questions"):
            raise InputError(f"{source}: a rubric needs a non-empty 'questions' list")
        check_keys(data, RUBRIC_KEYS, source)
        if not isinstance(data["questions"], list):
            raise InputError(f"{source}: 'questions' must be a list of questions (- id: ... lines)")
        questions = tuple(_question(q, f"{source}: question {n}") for n, q in enumerate(data["questions"], start=1))
        if warn_main and len(questions) > 1 and not any(q.main for q in questions) and source not in _warned:
            _warned.add(source)
            log.warning(
                "%s: no question has main: true, so the first, %s, is the main question (mark the one meant)",
                source,
                questions[0].id,
            )
        return cls(str(data.get("name", Path(source).stem)), questions, source)

    @classmethod
    def load(cls, path: str | Path) -> Rubric:
        return cls.from_dict(read_rubric(path), str(path))


def read_rubric(path: str | Path) -> dict:
    """The parsed YAML of a rubric file; a missing file, bytes that are not UTF-8 or a YAML syntax error is one
    :class:`InputError` naming the file (and the line and column)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: rubric file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise InputError(f"not UTF-8 text (byte {e.start})", file=str(path)) from None
    except yaml.YAMLError as e:
        raise yaml_error(e, str(path)) from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: a rubric must be a YAML mapping with a 'questions' list")
    return data


def _question(q, where: str) -> Question:
    """One question of a rubric mapping (``where``: the rubric and the question's number, for errors)."""
    if not isinstance(q, dict):
        raise InputError(f"{where} is not a mapping (id: ..., options: ... lines)")
    if "id" not in q:
        raise InputError(f"{where} has no 'id'")
    where = f"{where} ({q['id']})"
    check_keys(q, QUESTION_KEYS, where)
    raw_options = q.get("options") or []
    if not raw_options:
        raise InputError(f"{where} has no options")
    options = [_option(o, where) for o in raw_options]
    keys = [o.key for o in options]
    if len(set(keys)) != len(keys):
        raise InputError(f"{where}: duplicate option values {keys}")
    llm = tuple(option_key(v) for v in q.get("llm_options", [o.value for o in options]))
    numeric = all(o.numeric is not None and math.isfinite(o.numeric) for o in options)
    ordered = q.get("ordered", numeric)
    if not isinstance(ordered, bool):
        raise InputError(f"{where}: 'ordered' must be true or false, got {ordered!r}")
    if ordered and not numeric:
        raise InputError(f"{where}: ordered options need numeric values, got {[o.value for o in options]}")
    main = q.get("main", False)
    if not isinstance(main, bool):
        raise InputError(f"{where}: 'main' must be true or false, got {main!r}")
    return Question(
        id=str(q["id"]),
        prompt=str(q.get("prompt", "")).strip(),
        options=tuple(options),
        llm_options=llm,
        name=str(q.get("name", "")),
        main=main,
        applicable_if=q.get("applicable_if"),
        ordered=ordered,
    )


def _option(o, where: str) -> Option:
    """One answer option: a ``{value, label}`` mapping with a text label, or a bare value."""
    if not isinstance(o, dict):
        return Option(o, str(o))
    if "value" not in o:
        raise InputError(f"{where}: option {o} has no 'value'")
    label = o.get("label", o["value"])
    split = any(key not in OPTION_KEYS and value is None for key, value in o.items())  # an unquoted comma
    if "label" in o and (split or not isinstance(label, (str, int, float)) or isinstance(label, bool)):
        raise InputError(
            f"{where}: option {o} is not {{value, label}} with a text label; "
            "quote labels that contain commas or start with yes/no"
        )
    check_keys(o, OPTION_KEYS, f"{where}: option {o}")
    return Option(o["value"], str(label))
