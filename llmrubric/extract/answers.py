"""Generated answers read as options (docs/extract.md, "Modes without logprobs").

Each generated answer gets one status: ``parsed`` (it names an option), ``outside_options`` (it gives a
number or word that is no option), ``several_options`` (it lists options, ``"1.\n2."``, ``"1, 2, 3"``: no answer,
never its first), ``unparseable`` (nothing answer-like), ``refusal`` (the server flagged
it: ``finish_reason`` ``content_filter`` or a non-empty ``refusal`` field), ``truncated_reasoning`` (a reasoning cut
by the token budget, ``finish_reason`` ``length``), ``invalid_json`` or ``invalid_probabilities``
(a verbalized distribution that is not a JSON object of the options, or whose numbers are negative or
do not sum to 1 within the tolerance). Only ``parsed`` answers become counts; the rest are counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

ANSWER_STATUSES = (
    "parsed",
    "outside_options",
    "several_options",
    "unparseable",
    "refusal",
    "truncated_reasoning",
    "invalid_json",
    "invalid_probabilities",
)
FINAL_LINE = re.compile(r"answer\s*[:：]", re.IGNORECASE)
WORD = re.compile(r"[A-Za-z0-9_]+")
AFTER_LABEL = re.compile(r"\s*(?:$|[^\W\d_]|[.,:;!?)\]*_`'\"\-–—(])")  # a letter or punctuation: not "1 + 1 = 2"
LIST_GLUE = re.compile(
    r"(?:[\s.,:;/|)\]*_`'\"\-–—]|\b(?:or|and)\b)*"
)  # between listed options: "1, 2", "1.\n2.", "1 or 2"
LINE_ITEM = re.compile(r"\n\s*[*_`'\"(\[]*([^\s.):*_`'\"\]]+)\s*[.):]")  # a later line that starts like "2." or "(2)"


def refused(choice: dict) -> bool:
    """Whether the server flagged the choice as a refusal (content filter, or OpenAI's ``refusal`` field)."""
    message = choice.get("message") or {}
    return choice.get("finish_reason") == "content_filter" or bool(message.get("refusal"))


def choose(text: str, labels: Sequence[str]) -> tuple[int | None, str]:
    """The option a short answer names: (its index, ``parsed``) when the answer, stripped of spaces, quotes and
    markup, starts with a label (the longest that fits) followed by its end, a space and a word, or punctuation
    (``"3"``, ``"3. Likely"``, ``"**3**"``; not ``"1 + 1 = 2"`` nor ``"12"``) and names no other option as a list
    does (``"1, 2, 3"``, ``"1.\n2."``, ``"1 or 2"``: (None, ``several_options``)); else (None, ``outside_options``
    when its first word is a number or a single word, ``unparseable`` otherwise)."""
    answer = text.strip().lstrip("*_`'\"([ ").casefold()
    for i in sorted(range(len(labels)), key=lambda i: -len(labels[i])):
        label = labels[i].strip().casefold()
        rest = answer[len(label) :]
        if label and answer.startswith(label) and not rest[:1].isalnum() and AFTER_LABEL.match(rest):
            return (None, "several_options") if lists_another(rest, label, labels) else (i, "parsed")
    word = WORD.match(answer)
    if word and (word.group().isdigit() or answer[word.end() :].strip(" .!*_`'\")]") == ""):
        return None, "outside_options" if AFTER_LABEL.match(answer[word.end() :]) else "unparseable"
    return None, "unparseable"


def lists_another(rest: str, label: str, labels: Sequence[str]) -> bool:
    """Whether what follows an answer's first ``label`` names another option as a list does: right after it
    (separated by spaces, punctuation, "or", "and") or at the start of a later line (``"2."``, ``"(2)"``)."""
    others = {other.strip().casefold() for other in labels} - {label, ""}
    after = rest[LIST_GLUE.match(rest).end() :]
    for other in others:
        if after.startswith(other) and not after[len(other) : len(other) + 1].isalnum():
            return True
    return any(item.group(1) in others for item in LINE_ITEM.finditer(rest))


def final_answer(text: str) -> str:
    """What a reasoning ends with: the text after its last ``Answer:``, else its last non-empty line."""
    found = list(FINAL_LINE.finditer(text))
    if found:
        return text[found[-1].end() :]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def verbalized(text: str, labels: Sequence[str], tolerance: float) -> tuple[list[float] | None, str]:
    """A verbalized distribution: a JSON object with a number >= 0 per label summing to 1 within ``tolerance``,
    renormalised; (probabilities in label order, ``parsed``) or (None, ``invalid_json`` / ``invalid_probabilities``)."""
    try:
        data = json.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
    except (json.JSONDecodeError, TypeError):
        return None, "invalid_json"
    if not isinstance(data, dict) or any(label not in data for label in labels):
        return None, "invalid_json"
    values = [data[label] for label in labels]
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 for v in values):
        return None, "invalid_probabilities"
    total = float(sum(values))
    if total <= 0 or abs(total - 1.0) > tolerance:
        return None, "invalid_probabilities"
    return [float(v) / total for v in values], "parsed"
