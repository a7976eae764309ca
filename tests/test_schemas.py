"""Bad input: each case is a clear error naming file, row and column, and nothing is written."""

import numpy as np
import pandas as pd
import pytest

from llmrubric.io.errors import InputError
from llmrubric.io.files import write_table
from llmrubric.io.rows import check_unique, row_number
from llmrubric.io.tables import load_tables, read_table

ANN = "text_id,judge_id,question_id,answer\nt1,a,Q0,3\nt1,a,Q1,4.0\nt2,b,Q0,1\n"
FEAT = "".join(f"t{t},llm,{q},{o},0.25\n" for t in (1, 2) for q in ("Q0", "Q1") for o in (1, 2, 3, 4))
FEAT = "text_id,source,question_id,option,prob\n" + FEAT


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def load(tmp_path, rubric, ann=ANN, feat=FEAT, **kw):
    return load_tables(write(tmp_path, "ann.csv", ann), write(tmp_path, "feat.csv", feat), rubric, **kw)


def test_valid_tables_load_with_canonical_answers(tmp_path, rubric):
    tables = load(tmp_path, rubric)
    assert list(tables.annotations.answer) == ["3", "4", "1"]
    assert len(tables.features) == 16


def test_formats_round_trip(tmp_path, rubric):
    tables = load(tmp_path, rubric)
    for suffix in ("parquet", "jsonl", "tsv", "csv"):
        path = write_table(tables.features, tmp_path / f"f.{suffix}")
        back = read_table(path, "features")
        assert len(back) == 16 and set(back.columns) >= {"text_id", "prob"}


@pytest.mark.parametrize(
    "ann, feat, match, row, column",
    [
        ("text_id,judge_id,answer\nt1,a,3\n", FEAT, "missing required column", None, "question_id"),
        (ANN + "t2,b,Q11,2\n", FEAT, "unknown question id 'Q11'", 4, "question_id"),
        (ANN + "t2,b,Q1,5\n", FEAT, "answer '5' is not an option of Q1", 4, "answer"),
        (ANN + "t1,a,Q0,2\n", FEAT, "different answers in rows \\[1, 4\\]", 4, "answer"),
        (ANN, FEAT.replace("t1,llm,Q0,2,0.25", "t1,llm,Q0,2,-0.1"), "not a finite number >= 0", 2, "prob"),
        (ANN, FEAT.replace("t1,llm,Q0,2,0.25", "t1,llm,Q0,2,nan"), "not a finite number >= 0", 2, "prob"),
        (ANN, FEAT.replace("t1,llm,Q0,2,0.25", "t1,llm,Q0,2,0.2511"), "sum to 1.001100 > 1", 1, "prob"),
        (ANN, FEAT.replace("t2,llm,Q1,4,0.25\n", ""), "has 3 options", 13, "option"),
        (ANN + "t3,c,Q0,2\n", FEAT, "1 annotations on 1 texts have no features", 4, "text_id"),
        ("", FEAT, "empty", None, None),
        (ANN, "text_id,source,question_id,option,prob\n", "empty", None, None),
    ],
)
def test_bad_input_names_file_row_and_column(tmp_path, rubric, ann, feat, match, row, column):
    with pytest.raises(InputError, match=match) as info:
        load(tmp_path, rubric, ann, feat)
    assert info.value.file and info.value.file.endswith((".csv",))
    assert info.value.row == row
    assert info.value.column == column


def test_unfeatured_annotations_dropped_only_when_configured(tmp_path, rubric):
    tables = load(tmp_path, rubric, ANN + "t3,c,Q0,2\n", drop_unfeatured=True)
    assert set(tables.annotations.text_id) == {"t1", "t2"}


def test_identical_duplicates_are_dropped_and_rounds_are_separate(tmp_path, rubric):
    tables = load(tmp_path, rubric, ANN + "t1,a,Q0,3\n")
    assert len(tables.annotations) == 3
    rounds = "text_id,judge_id,question_id,answer,round\nt1,a,Q0,3,1\nt1,a,Q0,2,2\n"
    assert len(load(tmp_path, rubric, rounds).annotations) == 2


def test_failed_write_leaves_no_file(tmp_path):
    class Boom:
        def to_csv(self, *a, **k):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_table(Boom(), tmp_path / "out.csv")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="unknown table format"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "out.xlsx")


def test_check_unique_names_the_first_repeated_row_and_its_cells():
    df = pd.DataFrame({"run_id": ["r1", "r1", "r1"], "query_id": ["q1", "q2", "q1"]}, index=[1, 2, 3])
    check_unique(df.iloc[:2], ["run_id", "query_id"], "unused {run_id!r}", file="a.csv", column="query_id")
    with pytest.raises(InputError) as info:
        check_unique(
            df,
            ["run_id", "query_id"],
            "run {run_id!r} has two answers for {query_id!r}",
            file="a.csv",
            column="query_id",
        )
    assert str(info.value) == "a.csv, row 3, column 'query_id': run 'r1' has two answers for 'q1'"
    assert info.value.row == 3


def test_row_number_is_none_for_a_label_that_is_not_an_integer():
    assert row_number(np.int64(7)) == 7
    assert row_number("t1") is None
