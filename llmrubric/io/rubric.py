"""Rubric YAML → question objects: the only place where answer scales are written."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from llmrubric.io.errors import InputError


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
    def from_dict(cls, data: dict, source: str = "<memory>") -> Rubric:
        if not isinstance(data, dict) or not data.get("questions"):
            raise InputError(f"{source}: a rubric needs a non-empty 'questions' list")
        questions = []
        for n, q in enumerate(data["questions"], start=1):
            where = f"{source}: question {n}"
            if "id" not in q:
                raise InputError(f"{where} has no 'id'")
            raw_options = q.get("options") or []
            if not raw_options:
                raise InputError(f"{where} ({q['id']}) has no options")
            options = []
            for o in raw_options:
                if isinstance(o, dict):
                    if "value" not in o:
                        raise InputError(f"{where} ({q['id']}): option {o} has no 'value'")
                    if (
                        "label" in o
                        and not isinstance(o["label"], (str, int, float))
                        or isinstance(o.get("label"), bool)
                        or len(o) > 2
                    ):
                        raise InputError(
                            f"{where} ({q['id']}): option {o} is not {{value, label}} with a text label; "
                            "quote labels that contain commas or start with yes/no"
                        )
                    options.append(Option(o["value"], str(o.get("label", o["value"]))))
                else:
                    options.append(Option(o, str(o)))
            keys = [o.key for o in options]
            if len(set(keys)) != len(keys):
                raise InputError(f"{where} ({q['id']}): duplicate option values {keys}")
            llm = tuple(option_key(v) for v in q.get("llm_options", [o.value for o in options]))
            numeric = all(o.numeric is not None and math.isfinite(o.numeric) for o in options)
            ordered = q.get("ordered", numeric)
            if not isinstance(ordered, bool):
                raise InputError(f"{where} ({q['id']}): 'ordered' must be true or false, got {ordered!r}")
            if ordered and not numeric:
                raise InputError(
                    f"{where} ({q['id']}): ordered options need numeric values, got {[o.value for o in options]}"
                )
            questions.append(
                Question(
                    id=str(q["id"]),
                    prompt=str(q.get("prompt", "")).strip(),
                    options=tuple(options),
                    llm_options=llm,
                    name=str(q.get("name", "")),
                    main=bool(q.get("main", False)),
                    applicable_if=q.get("applicable_if"),
                    ordered=ordered,
                )
            )
        return cls(str(data.get("name", Path(source).stem)), tuple(questions), source)

    @classmethod
    def load(cls, path: str | Path) -> Rubric:
        path = Path(path)
        if not path.is_file():
            raise InputError(f"{path}: rubric file not found")
        with path.open() as f:
            data = yaml.safe_load(f)
        return cls.from_dict(data, str(path))
