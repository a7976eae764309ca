"""The AutoNuggetizer's JSONL (castorini/nuggetizer, ``cli/adapters.py``) → a nugget test bank,
texts, nugget assignments and ``nugget_support`` feature blocks.

- nuggets (its ``create`` output): ``{query, qid, nuggets: [{text, importance}]}`` per query →
  test-bank items (``llmrubric.extract.testbank.Item``, kind ``nugget``, id from query id and text);
  ``importance`` defaults to ``vital`` (as its reader does); ``failed`` (its scorer's failure) is
  kept as ``okay`` with ``nuggetizer_importance: failed``, which its own metrics count the same way.
- assignments (its ``assign`` output), one line per answer ``{query, qid, answer_text, run_id,
  nuggets: [{text, importance, assignment}]}`` (text id ``<qid>/<run_id>``, system the run) or per
  retrieved passage ``{text, qid, candidate_text, docid, nuggets}`` (text id ``<qid>/<docid>``,
  system the query, as for the workbench's passages). ``assignment``: ``support``,
  ``partial_support``, ``not_support``; ``failed`` (no answer from its LLM) is left out (counted).

Each assignment is written twice: as a row ``text_id, item_id, label`` (what ``llmrubric ir nuggets
--assignments`` reads) and as the block ``nugget_support:<item_id>`` (options the three labels,
probability 1 on the label), the LLM's judgment that a calibrator or ``extract summaries`` take.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from llmrubric.extract.testbank import IMPORTANCE, Item
from llmrubric.io.errors import InputError
from llmrubric.ir.lines import a_list, an_id, an_object, json_lines
from llmrubric.ir.nuggets import LABELS
from llmrubric.ir.workbench import FEATURES, Imported, text_id

FAMILY = "nugget_support"
FAILED = "failed"


def _nugget(record: dict, qid: str, i: int) -> Item:
    nugget = an_object(record, f"nuggets[{i}]")
    text = nugget.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"nuggets[{i}].text {text!r} is not a non-empty string")
    importance = nugget.get("importance", "vital")
    if importance == FAILED:
        return Item.new(qid, "nugget", text, "okay", nuggetizer_importance=FAILED)
    if importance not in IMPORTANCE:
        raise ValueError(f"nuggets[{i}].importance {importance!r} is not one of {(*IMPORTANCE, FAILED)}")
    return Item.new(qid, "nugget", text, importance)


def _add(bank: dict, item: Item, path: str, n: int) -> None:
    before = bank.setdefault(item.item_id, (item, n))
    if before[0].importance != item.importance:
        raise InputError(
            f"nugget {item.text!r} of query {item.query_id!r} is {item.importance}, {before[0].importance} on line {before[1]}",
            file=path,
            line=n,
        )


def read_nuggets(path: str | Path) -> list[Item]:
    """The nuggets of every query, in the file's order; a query twice or a malformed line is an error."""
    bank: dict = {}
    queries: dict[str, int] = {}
    for n, record in json_lines(path, "nuggets"):
        try:
            record = an_object(record, "a nuggets line")
            qid = an_id(record.get("qid"), "qid")
            if qid in queries:
                raise ValueError(f"query {qid!r} is also on line {queries[qid]}")
            queries[qid] = n
            items = [_nugget(x, qid, i) for i, x in enumerate(a_list(record.get("nuggets"), "nuggets"))]
        except ValueError as e:
            raise InputError(str(e), file=str(path), line=n) from None
        for item in items:
            _add(bank, item, str(path), n)
    return [item for item, _ in bank.values()]


def read_assignments(
    paths: list[str | Path], bank: list[Item] | None = None, source: str = "nuggetizer", with_text: bool = False
) -> tuple[Imported, list[Item], pd.DataFrame]:
    """(tables, bank, assignments ``text_id, item_id, label``) of the assignment files. With ``bank``
    (from :func:`read_nuggets`) every assigned nugget must be in it; without, the bank is the assigned
    nuggets. An answer or passage twice, a nugget twice for one text, or an unknown label is an error."""
    known = {(i.query_id, i.item_id) for i in bank} if bank is not None else None
    found: dict = {}
    texts: dict[str, tuple] = {}
    rows: list[tuple] = []
    failed = 0
    for path in paths:
        for n, record in json_lines(path, "assignments"):
            try:
                record = an_object(record, "an assignments line")
                qid = an_id(record.get("qid"), "qid")
                if "docid" in record:
                    unit, system, kind = an_id(record["docid"], "docid"), qid, "candidate_text"
                    doc = unit
                elif "run_id" in record:
                    unit, kind, doc = an_id(record["run_id"], "run_id"), "answer_text", None
                    system = unit
                else:
                    raise ValueError("neither docid (retrieval assignments) nor run_id (answer assignments)")
                tid = text_id(qid, unit)
                if tid in texts:
                    raise ValueError(f"text {tid!r} is also on {texts[tid][-1]}")
                body = record.get(kind)
                texts[tid] = (tid, qid, doc, system, body if isinstance(body, str) else None, f"{path}, line {n}")
                seen: set = set()
                for i, x in enumerate(a_list(record.get("nuggets"), "nuggets")):
                    item = _nugget(x, qid, i)
                    label = an_object(x, f"nuggets[{i}]").get("assignment")
                    if item.item_id in seen:
                        raise ValueError(f"nugget {item.text!r} is assigned twice")
                    seen.add(item.item_id)
                    if known is not None and (qid, item.item_id) not in known:
                        raise ValueError(f"nugget {item.text!r} is not in the nuggets of query {qid!r}")
                    if label == FAILED:
                        failed += 1
                        continue
                    if label not in LABELS:
                        raise ValueError(f"nuggets[{i}].assignment {label!r} is not one of {(*LABELS, FAILED)}")
                    _add(found, item, str(path), n)
                    rows.append((tid, item.item_id, label))
            except ValueError as e:
                raise InputError(str(e), file=str(path), line=n) from None
    table = pd.DataFrame(
        [t[:5] for t in texts.values()], columns=["text_id", "query_id", "doc_id", "system_id", "text"]
    )
    if not with_text:
        table = table.drop(columns="text")
    assignments = pd.DataFrame(rows, columns=["text_id", "item_id", "label"])
    features = pd.DataFrame(
        [(t, source, f"{FAMILY}:{i}", o, float(o == label)) for t, i, label in rows for o in LABELS],
        columns=FEATURES,
    )
    annotations = pd.DataFrame(columns=["text_id", "judge_id", "question_id", "answer"])
    counts = {"texts": len(table), "queries": table.query_id.nunique(), "assignments": len(rows), "failed": failed}
    items = bank if bank is not None else [item for item, _ in found.values()]
    return Imported(features, table, annotations, counts), items, assignments
