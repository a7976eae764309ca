"""The RUBRIC autograder workbench's graded-passages JSONL(.gz) → features, texts and annotations.

The format is the workbench's own (TREMA-UNH/rubric-grading-workbench, ``exam_pp/data_model.py``):
one line per query, ``[query_id, [paragraph, ...]]``; a paragraph (``FullParagraphData``) has
``paragraph_id``, ``text``, ``paragraph_data`` (``judgments``: ``paragraphId, query, relevance,
titleQuery``), ``exam_grades`` (``ExamGrades``, one per prompt class) and ``grades`` (``Grades``,
paragraph-level direct grades). Read as:

- text id ``<query_id>/<paragraph_id>`` (:func:`text_id`): a passage under two queries is two texts;
  the texts table has ``text_id, query_id, doc_id`` (the paragraph id), ``system_id`` (the query id,
  so that system protocols group by query) and, if asked, ``text``;
- an ``ExamGrades`` entry's ``self_ratings`` (item ``question_id``, else ``nugget_id``; 0–5) →
  block ``self_rating:<item_id>``, options 0–5, probability 1 on the rating; its ``correctAnswered``
  / ``wrongAnswered`` → block ``answered:<item_id>``, options no / yes. The source of both is the
  entry's ``prompt_info.prompt_class`` (``QuestionPromptWithChoices`` when absent, as in the workbench);
- a ``Grades`` entry → ``direct_grade`` (options 0–5, from its ``self_ratings``, when given) and
  ``direct_answered`` (no / yes, from ``correctAnswered``), source its prompt class;
- ``judgments`` → annotations ``text_id, judge_id, question_id, answer`` (the relevance label).

Not read: ``answers`` (the LLM's free text), ``exam_ratio`` (derived from the answered items),
``relevance_label``, ``rankings``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from llmrubric.io.errors import InputError
from llmrubric.ir.lines import a_list, an_id, an_object, json_lines

SELF_RATING = "self_rating"
ANSWERED = "answered"
DIRECT_GRADE = "direct_grade"
DIRECT_ANSWERED = "direct_answered"
GRADES = tuple(str(g) for g in range(6))
YES_NO = ("no", "yes")
DEFAULT_PROMPT_CLASS = "QuestionPromptWithChoices"
FEATURES = ["text_id", "source", "question_id", "option", "prob"]
ANNOTATIONS = ["text_id", "judge_id", "question_id", "answer"]


def text_id(query_id: str, passage_id: str) -> str:
    """The text id of a passage graded for a query: ``<query_id>/<passage_id>``."""
    return f"{query_id}/{passage_id}"


@dataclass
class Imported:
    """Tables read from an ecosystem's files, and the counts reported on the command line."""

    features: pd.DataFrame
    texts: pd.DataFrame
    annotations: pd.DataFrame
    counts: dict = field(default_factory=dict)


def _grade(value, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or str(value) not in GRADES:
        raise ValueError(f"{what} {value!r} is not an integer grade 0..5")
    return str(value)


def _prompt_class(entry: dict, what: str) -> str:
    info = entry.get("prompt_info")
    if info is None:
        return DEFAULT_PROMPT_CLASS
    return an_id(
        an_object(info, f"{what}.prompt_info").get("prompt_class", DEFAULT_PROMPT_CLASS), f"{what} prompt_class"
    )


class _Reader:
    """Rows of the tables, collected line by line; a ValueError is one line's error."""

    def __init__(self, judge_id: str, question_id: str, with_text: bool):
        self.judge_id, self.question_id, self.with_text = judge_id, question_id, with_text
        self.features: list[tuple] = []
        self.texts: list[tuple] = []
        self.annotations: dict[str, tuple[str, int]] = {}  # text id → (answer, line)
        self.line_of: dict[str, int] = {}

    def block(self, text: str, source: str, question: str, options: tuple[str, ...], answer: str, seen: set):
        if (source, question) in seen:
            raise ValueError(f"{question!r} of prompt class {source!r} is given twice")
        seen.add((source, question))
        self.features.extend((text, source, question, o, 1.0 if o == answer else 0.0) for o in options)

    def line(self, data, n: int) -> None:
        if not (isinstance(data, list) and len(data) == 2 and isinstance(data[1], list)):
            raise ValueError("a line must be [query_id, [paragraph, ...]]")
        query = an_id(data[0], "query_id")
        for k, paragraph in enumerate(data[1]):
            where = f"paragraph {k}"
            try:
                paragraph = an_object(paragraph, where)
                where = f"paragraph {k} ({paragraph.get('paragraph_id')!r})"
                self.paragraph(query, paragraph, n)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None

    def paragraph(self, query: str, p: dict, n: int) -> None:
        passage = an_id(p.get("paragraph_id"), "paragraph_id")
        text = text_id(query, passage)
        if text in self.line_of:
            raise ValueError(f"passage {passage!r} of query {query!r} is also on line {self.line_of[text]}")
        self.line_of[text] = n
        body = p.get("text")
        if body is not None and not isinstance(body, str):
            raise ValueError("text is not a string")
        self.texts.append((text, query, passage, query, body or None))
        seen: set = set()
        for i, entry in enumerate(a_list(p.get("exam_grades"), "exam_grades")):
            self.exam_grades(text, an_object(entry, f"exam_grades[{i}]"), f"exam_grades[{i}]", seen)
        for i, entry in enumerate(a_list(p.get("grades"), "grades")):
            self.direct(text, an_object(entry, f"grades[{i}]"), f"grades[{i}]", seen)
        data = p.get("paragraph_data") or {}
        for i, j in enumerate(a_list(an_object(data, "paragraph_data").get("judgments"), "judgments")):
            self.judgment(an_object(j, f"judgments[{i}]"), f"judgments[{i}]", n)

    def exam_grades(self, text: str, entry: dict, what: str, seen: set) -> None:
        source = _prompt_class(entry, what)
        for i, rating in enumerate(a_list(entry.get("self_ratings"), f"{what}.self_ratings")):
            rating = an_object(rating, f"{what}.self_ratings[{i}]")
            item = rating.get("question_id")
            item = an_id(item if item is not None else rating.get("nugget_id"), f"{what}.self_ratings[{i}] item id")
            grade = _grade(rating.get("self_rating"), f"{what}.self_ratings[{i}].self_rating")
            self.block(text, source, f"{SELF_RATING}:{item}", GRADES, grade, seen)
        correct = [
            an_id(q, f"{what}.correctAnswered item") for q in a_list(entry.get("correctAnswered"), "correctAnswered")
        ]
        wrong = [an_id(q, f"{what}.wrongAnswered item") for q in a_list(entry.get("wrongAnswered"), "wrongAnswered")]
        both = set(correct) & set(wrong)
        if both:
            raise ValueError(f"{what}: item {sorted(both)[0]!r} is both correctAnswered and wrongAnswered")
        for items, answer in ((correct, "yes"), (wrong, "no")):
            for item in items:
                self.block(text, source, f"{ANSWERED}:{item}", YES_NO, answer, seen)

    def direct(self, text: str, entry: dict, what: str, seen: set) -> None:
        source = _prompt_class(entry, what)
        if entry.get("self_ratings") is not None:
            self.block(text, source, DIRECT_GRADE, GRADES, _grade(entry["self_ratings"], f"{what}.self_ratings"), seen)
        answered = entry.get("correctAnswered")
        if not isinstance(answered, bool):
            raise ValueError(f"{what}.correctAnswered {answered!r} is not true or false")
        self.block(text, source, DIRECT_ANSWERED, YES_NO, YES_NO[answered], seen)

    def judgment(self, j: dict, what: str, n: int) -> None:
        label = j.get("relevance")
        if isinstance(label, bool) or not isinstance(label, int):
            raise ValueError(f"{what}.relevance {label!r} is not an integer")
        text = text_id(an_id(j.get("query"), f"{what}.query"), an_id(j.get("paragraphId"), f"{what}.paragraphId"))
        before = self.annotations.setdefault(text, (str(label), n))
        if before[0] != str(label):
            raise ValueError(f"{what}: relevance {label} of {text!r} disagrees with {before[0]} on line {before[1]}")


def read_workbench(
    path: str | Path,
    judge_id: str = "assessor",
    question_id: str = "relevance",
    with_text: bool = False,
    progress: bool = False,
) -> Imported:
    """The workbench file's features, texts and (from ``judgments``) annotations; a malformed line is
    one :class:`InputError` naming the file and line. Judgments of passages not in the file are dropped
    (counted)."""
    reader = _Reader(judge_id, question_id, with_text)
    for n, data in json_lines(path, "workbench", progress):
        try:
            reader.line(data, n)
        except ValueError as e:
            raise InputError(str(e), file=str(path), line=n) from None
    features = pd.DataFrame(reader.features, columns=FEATURES)
    texts = pd.DataFrame(reader.texts, columns=["text_id", "query_id", "doc_id", "system_id", "text"])
    if not with_text:
        texts = texts.drop(columns="text")
    known = [(t, a) for t, (a, _) in reader.annotations.items() if t in reader.line_of]
    annotations = pd.DataFrame([(t, judge_id, question_id, a) for t, a in known], columns=ANNOTATIONS)
    for df in (features, texts, annotations):
        df.attrs["source"] = str(path)
    counts = {
        "texts": len(texts),
        "queries": texts.query_id.nunique(),
        "sources": sorted(features.source.unique()),
        "blocks": int(len(features.drop_duplicates(["text_id", "source", "question_id"]))),
        "judgments": len(annotations),
        "judgments_dropped": len(reader.annotations) - len(known),
    }
    return Imported(features, texts, annotations, counts)
