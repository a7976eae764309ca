"""``llmrubric import workbench | nuggetizer`` and ``ir qrels --annotations``: the RUBRIC workbench's
JSONL, TREC qrels and the AutoNuggetizer's JSONL read field for field (hand-written fixtures in
tests/fixtures/ and the shared LLMJudge test split), malformed lines, the qrels round trip, and
tables that train."""

from __future__ import annotations

import gzip
import json
import re
import shutil

import pandas as pd
import pytest
from support.paths import ROOT
from support.scripts import run

from llmrubric import load_tables
from llmrubric.cli import main as cli
from llmrubric.extract.testbank import item_id, read_bank
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.ir import nuggets as ng
from llmrubric.ir.autograder import read_qrels, write_qrels
from llmrubric.ir.judgments import add_qrels, qrels_annotations, qrels_labels
from llmrubric.ir.nuggetizer import read_assignments, read_nuggets
from llmrubric.ir.workbench import read_workbench

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("import_formats")

FIXTURES = ROOT / "tests" / "fixtures"
WORKBENCH = FIXTURES / "workbench.jsonl"
LLMJUDGE = ROOT.parent / "shared" / "data" / "llmjudge-test"
SELF_RATED = "QuestionSelfRatedUnanswerablePromptWithChoices"


def _block(features: pd.DataFrame, text: str, source: str, question: str) -> dict:
    rows = features[(features.text_id == text) & (features.source == source) & (features.question_id == question)]
    return dict(zip(rows.option, rows.prob))


def test_the_workbench_fixture_is_read_field_for_field():
    got = read_workbench(WORKBENCH)
    assert list(got.texts.text_id) == ["101/d1", "101/d2", "102/d1"]
    assert list(got.texts.doc_id) == ["d1", "d2", "d1"] and list(got.texts.system_id) == ["101", "101", "102"]
    assert "text" not in got.texts.columns
    f = got.features
    assert _block(f, "101/d1", SELF_RATED, "self_rating:101/a") == {str(g): float(g == 5) for g in range(6)}
    assert _block(f, "102/d1", SELF_RATED, "self_rating:102/a")["3"] == 1.0
    assert (
        _block(f, "101/d1", "NuggetSelfRatedPrompt", "self_rating:101/n1")["4"] == 1.0
    )  # nugget_id when no question_id
    assert _block(f, "101/d1", SELF_RATED, "answered:101/b") == {"no": 1.0, "yes": 0.0}
    assert _block(f, "101/d2", SELF_RATED, "answered:101/a") == {"no": 1.0, "yes": 0.0}
    assert _block(f, "101/d1", "FagB", "direct_grade")["4"] == 1.0
    assert _block(f, "101/d1", "FagB", "direct_answered") == {"no": 0.0, "yes": 1.0}
    assert set(f[f.source == "FagB"].text_id) == {"101/d1"}
    assert f.groupby(["text_id", "source", "question_id"]).prob.sum().eq(1.0).all()
    assert list(got.annotations.itertuples(index=False)) == [
        ("101/d1", "assessor", "relevance", "3"),
        ("101/d2", "assessor", "relevance", "0"),
        ("102/d1", "assessor", "relevance", "1"),
    ]
    assert read_workbench(WORKBENCH, with_text=True).texts.text.tolist()[:2] == [
        "Cats purr when content.",
        "Dogs bark.",
    ]


def test_a_gzip_file_reads_the_same(tmp_path):
    packed = tmp_path / "grades.jsonl.gz"
    packed.write_bytes(gzip.compress(WORKBENCH.read_bytes()))
    pd.testing.assert_frame_equal(read_workbench(packed).features, read_workbench(WORKBENCH).features)


def test_qrels_become_the_judges_annotations_and_passages_outside_the_file_are_dropped(tmp_path):
    got = read_workbench(WORKBENCH)
    qrels = read_qrels(FIXTURES / "workbench.qrels")
    merged, dropped = add_qrels(got.annotations.iloc[:1], got.texts, qrels, "assessor", "relevance")
    assert dropped == 1  # 102 d9 is not in the workbench file
    assert dict(zip(merged.text_id, merged.answer)) == {"101/d1": "3", "101/d2": "0", "102/d1": "1"}
    bad = tmp_path / "bad.qrels"
    bad.write_text("101 0 d1 3\n101 0 d2 2\n")
    with pytest.raises(InputError, match=r"bad.qrels, line 2: relevance 2 of '101/d2' disagrees"):
        add_qrels(got.annotations, got.texts, read_qrels(bad), "assessor", "relevance")


def test_qrels_to_annotations_to_qrels_is_the_same_file(tmp_path):
    path = FIXTURES / "workbench.qrels"
    annotations, texts = qrels_annotations(read_qrels(path), "assessor", "relevance")
    write_qrels(qrels_labels(annotations, texts, "assessor", "relevance"), tmp_path / "q")
    assert (tmp_path / "q").read_bytes() == path.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("path", [FIXTURES / "workbench.qrels", LLMJUDGE / "qrels.txt"], ids=["fixture", "llmjudge"])
def test_ir_qrels_exports_annotations_as_the_same_qrels_file(path, tmp_path):
    if not path.is_file():
        pytest.skip(f"{path} not found")
    annotations, texts = qrels_annotations(read_qrels(path), "assessor", "relevance")
    annotations.to_csv(tmp_path / "a.csv", index=False)
    texts.to_csv(tmp_path / "t.csv", index=False)
    argv = ["ir", "qrels", "--annotations", f"{tmp_path}/a.csv", "--texts", f"{tmp_path}/t.csv"]
    assert cli([*argv, "--judge-id", "assessor", "--out", f"{tmp_path}/q"]) == 0
    assert (tmp_path / "q").read_bytes() == path.read_bytes()


def test_qrels_of_annotations_need_one_judge_and_integer_labels():
    annotations, texts = qrels_annotations(read_qrels(FIXTURES / "workbench.qrels"), "a", "relevance")
    two = pd.concat([annotations, annotations.assign(judge_id="b")], ignore_index=True)
    with pytest.raises(InputError, match=r"judges \['a', 'b'\]: give one"):
        qrels_labels(two, texts, None, "relevance")
    assert len(qrels_labels(two, texts, "b", "relevance")) == 4
    with pytest.raises(InputError, match="is not an integer"):
        qrels_labels(annotations.assign(answer="2.5"), texts, None, "relevance")


@pytest.mark.slow
def test_the_import_command_writes_tables_that_load_and_summaries_as_extract_summaries_does(tmp_path, capsys):
    out = tmp_path / "wb"
    argv = ["import", "workbench", str(WORKBENCH), "--qrels", str(FIXTURES / "workbench.qrels")]
    assert cli([*argv, "--out-dir", str(out), "--summaries", "--format", "csv", "--no-progress"]) == 0
    assert "1 qrels_dropped" in capsys.readouterr().out
    tables = load_tables(
        out / "annotations.csv",
        out / "summaries.csv",
        Rubric.load(ROOT / "conf/rubric/relevance.yaml"),
        out / "texts.csv",
    )
    assert sorted(tables.annotations.answer) == ["0", "1", "3"]
    assert (
        cli(
            [
                "extract",
                "summaries",
                str(out / "features.csv"),
                "--family",
                "self_rating",
                "--out",
                str(tmp_path / "s.csv"),
            ]
        )
        == 0
    )
    ours, theirs = pd.read_csv(out / "summaries.csv"), pd.read_csv(tmp_path / "s.csv")
    pd.testing.assert_frame_equal(ours, theirs)
    # by hand: the fixture's self-ratings, their mean, max and share ≥ g (a rating is a point mass)
    ratings = {("101/d1", SELF_RATED): [5, 2], ("101/d1", "NuggetSelfRatedPrompt"): [4]}
    ratings |= {("101/d2", SELF_RATED): [0, 1], ("102/d1", SELF_RATED): [3]}
    expected = {}
    for (text, source), r in ratings.items():
        for g in range(6):
            expected[text, source, "self_rating.mean", str(g)] = r.count(g) / len(r)
            expected[text, source, "self_rating.max", str(g)] = float(max(r) == g)
        for g in range(1, 6):
            expected[text, source, f"self_rating.cov_ge{g}", "covered"] = sum(v >= g for v in r) / len(r)
    got = ours.set_index(["text_id", "source", "question_id", "option"]).prob
    assert got.index.is_unique
    assert got.to_dict() == pytest.approx(expected, abs=1e-12)


def _paragraph(**change) -> dict:
    line = json.loads(WORKBENCH.read_text().splitlines()[1])
    line[1][0].update(change)
    return line


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"query": "102"}), r"a line must be \[query_id, \[paragraph, \.\.\.\]\]"),
        (
            json.dumps(_paragraph(exam_grades=[{"self_ratings": [{"question_id": "q", "self_rating": 7}]}])),
            r"paragraph 0 \('d1'\): exam_grades\[0\]\.self_ratings\[0\]\.self_rating 7 is not an integer grade 0\.\.5",
        ),
        (
            json.dumps(_paragraph(exam_grades=[{"correctAnswered": ["q"], "wrongAnswered": ["q"]}])),
            "item 'q' is both correctAnswered and wrongAnswered",
        ),
        (
            json.dumps(_paragraph(grades=[{"correctAnswered": "yes"}])),
            r"grades\[0\]\.correctAnswered 'yes' is not true",
        ),
        (json.dumps(["101", [{"paragraph_id": "d2"}]]), "passage 'd2' of query '101' is also on line 1"),
    ],
    ids=["json", "shape", "grade", "answered", "direct", "twice"],
)
def test_a_malformed_line_is_one_error_naming_file_and_line(bad, message, tmp_path):
    path = tmp_path / "grades.jsonl"
    path.write_text(WORKBENCH.read_text().splitlines()[0] + "\n" + bad + "\n")
    with pytest.raises(InputError) as error:
        read_workbench(path)
    assert str(error.value).startswith(f"{path}, line 2: ") and "\n" not in str(error.value)
    assert re.search(message, str(error.value)), error.value


@pytest.mark.slow
def test_the_import_command_reports_a_malformed_line_on_one_line_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "grades.jsonl"
    path.write_text(WORKBENCH.read_text() + "[1, 2]\n")
    out = tmp_path / "out"
    assert cli(["import", "workbench", str(path), "--out-dir", str(out), "--summaries", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {path}, line 3: a line must be [query_id, [paragraph, ...]]\n"
    assert not out.exists()


def test_nuggetizer_nuggets_become_a_test_bank():
    bank = read_nuggets(FIXTURES / "nuggetizer_nuggets.jsonl")
    assert [(i.query_id, i.importance) for i in bank] == [
        ("101", "vital"),
        ("101", "okay"),
        ("101", "vital"),
        ("102", "okay"),
    ]
    assert bank[0].item_id == item_id("101", "Cats purr when content") and bank[0].kind == "nugget"
    assert bank[3].extra == {"nuggetizer_importance": "failed"}


def test_nuggetizer_assignments_score_as_the_nuggetizer_does_and_failed_ones_are_left_out():
    bank = read_nuggets(FIXTURES / "nuggetizer_nuggets.jsonl")
    got, items, assignments = read_assignments([FIXTURES / "nuggetizer_answers.jsonl"], bank)
    assert list(got.texts.text_id) == ["101/runA", "101/runB"] and list(got.texts.system_id) == ["runA", "runB"]
    assert got.counts["failed"] == 1 and len(assignments) == 5 and items is bank
    scores = ng.answer_scores(ng.support_from_labels(assignments), got.texts, bank).set_index("text_id")
    assert scores.loc["101/runA", "A_strict"] == pytest.approx(1 / 3)
    assert scores.loc["101/runA", "V_partial"] == pytest.approx(0.75)
    assert scores.loc["101/runB", "status"].startswith("incomplete")
    from_features = ng.answer_scores(ng.support_from_features(got.features), got.texts, bank).set_index("text_id")
    pd.testing.assert_frame_equal(from_features, scores)
    retrieval, _, _ = read_assignments([FIXTURES / "nuggetizer_retrieval.jsonl"])
    assert retrieval.texts.iloc[0].to_dict() == {
        "text_id": "101/d1",
        "query_id": "101",
        "doc_id": "d1",
        "system_id": "101",
    }


def test_a_nugget_outside_the_bank_or_an_unknown_label_is_an_error_naming_the_line(tmp_path):
    bank = read_nuggets(FIXTURES / "nuggetizer_nuggets.jsonl")
    lines = (FIXTURES / "nuggetizer_answers.jsonl").read_text().splitlines()
    path = tmp_path / "a.jsonl"
    path.write_text(lines[0] + "\n" + lines[1].replace("Purring is a vibration", "Purring is loud") + "\n")
    with pytest.raises(
        InputError, match=r"a.jsonl, line 2: nugget 'Purring is loud' is not in the nuggets of query '101'"
    ):
        read_assignments([path], bank)
    path.write_text(lines[0].replace('"partial_support"', '"maybe"') + "\n")
    with pytest.raises(InputError, match=r"line 1: nuggets\[2\]\.assignment 'maybe' is not one of"):
        read_assignments([path], bank)


@pytest.mark.slow
def test_the_nuggetizer_command_writes_what_ir_nuggets_reads(tmp_path, capsys):
    out = tmp_path / "ng"
    argv = ["import", "nuggetizer", "--nuggets", str(FIXTURES / "nuggetizer_nuggets.jsonl")]
    assert (
        cli(
            [
                *argv,
                "--assignments",
                str(FIXTURES / "nuggetizer_answers.jsonl"),
                "--out-dir",
                str(out),
                "--format",
                "csv",
            ]
        )
        == 0
    )
    assert len(read_bank(out / "bank.jsonl")[0]) == 4
    argv = ["ir", "nuggets", "--answers", str(out / "texts.csv"), "--bank", str(out / "bank.jsonl")]
    assert cli([*argv, "--assignments", str(out / "assignments.csv"), "--out-dir", str(tmp_path / "scores")]) == 0
    runs = pd.read_csv(tmp_path / "scores" / "runs.csv").set_index("run_id")
    assert runs.loc["runA", "A_strict"] == pytest.approx(1 / 3) and runs.loc["runB", "left_out"] == 1


@pytest.fixture(scope="module")
def llmjudge(tmp_path_factory):
    if not (LLMJUDGE / "rubric-grades.jsonl.gz").is_file():
        pytest.skip(f"the LLMJudge test split is not at {LLMJUDGE}")
    out = tmp_path_factory.mktemp("llmjudge")
    argv = ["import", "workbench", str(LLMJUDGE / "rubric-grades.jsonl.gz"), "--qrels", str(LLMJUDGE / "qrels.txt")]
    assert cli([*argv, "--out-dir", str(out), "--no-progress"]) == 0
    return out


@pytest.mark.slow
def test_the_shared_llmjudge_file_reads_as_its_readme_says(llmjudge):
    texts = pd.read_parquet(llmjudge / "texts.parquet")
    assert len(texts) == 4423 and texts.system_id.nunique() == 25 and texts.text_id.is_unique
    labels = pd.read_parquet(llmjudge / "annotations.parquet").answer.value_counts()
    assert [labels[str(g)] for g in range(4)] == [2005, 1233, 808, 377]
    features = pd.read_parquet(llmjudge / "features.parquet")
    assert features.source.nunique() == 4
    known = _block(features, "q49/p3659", SELF_RATED, "self_rating:q49/ff0a847b4be11df2989f21925303a09e")
    assert known["3"] == 1.0 and sum(known.values()) == 1.0
    assert _block(features, "q49/p3659", SELF_RATED, "answered:q49/b22a803ebc9c65776cf9df075299fa08")["yes"] == 1.0


@pytest.mark.slow
def test_a_few_imported_queries_train_by_query_groups(tmp_path):
    source = LLMJUDGE / "rubric-grades.jsonl.gz"
    if not source.is_file():
        pytest.skip(f"the LLMJudge test split is not at {LLMJUDGE}")
    with gzip.open(source, "rt") as f:
        head = [next(f) for _ in range(3)]
    subset = tmp_path / "three.jsonl.gz"
    subset.write_bytes(gzip.compress("".join(head).encode()))
    out = tmp_path / "tables"
    argv = ["import", "workbench", str(subset), "--qrels", str(LLMJUDGE / "qrels.txt"), "--summaries"]
    assert cli([*argv, "--out-dir", str(out), "--no-progress"]) == 0
    data = [
        f"data.train.{t}={out / f'{n}.parquet'}"
        for t, n in [("annotations", "annotations"), ("features", "summaries"), ("texts", "texts")]
    ]
    tables = load_tables(
        out / "annotations.parquet", out / "summaries.parquet", Rubric.load(ROOT / "conf/rubric/relevance.yaml")
    )
    # by hand from the JSON and the qrels file: each passage of the 3 queries, labelled with its qrels grade
    lines = [json.loads(line) for line in head]
    passages = {(q, p["paragraph_id"]) for q, paragraphs in lines for p in paragraphs}
    qrels = {
        (q, doc): grade for q, _, doc, grade in (r.split() for r in (LLMJUDGE / "qrels.txt").read_text().splitlines())
    }
    expected = {f"{q}/{doc}": qrels[q, doc] for q, doc in passages}
    assert len(expected) == sum(len(paragraphs) for _, paragraphs in lines)
    assert dict(zip(tables.annotations.text_id, tables.annotations.answer)) == expected
    assert len(tables.annotations) == len(expected)
    texts = pd.read_parquet(out / "texts.parquet")
    assert sorted(texts.text_id) == sorted(expected) and set(texts.system_id) == {q for q, _ in lines}
    args = ["rubric=relevance", *data, "trainer=fast", "model=default", "protocol=system_groups", "system_groups=3"]
    done = run("train.py", *args, f"run_dir={tmp_path / 'run'}", "logger=none", "model.ensemble=1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "fold0.safetensors").is_file()
    folds = pd.read_csv(tmp_path / "run" / "folds.csv", dtype=str)
    first = folds[folds.grouping == "0"]
    assert first.fold.nunique() == 3 and first.groupby("system_id").fold.nunique().eq(1).all()  # one query, one fold
    assert set(first.system_id) == {q for q, _ in lines}
    shutil.rmtree(tmp_path / "run")


@pytest.mark.slow
def test_an_unknown_table_format_in_the_settings_is_one_error_naming_the_setting(tmp_path, capsys):
    config = tmp_path / "ir.yaml"
    config.write_text("imports:\n  format: xlsx\n")
    argv = ["import", "workbench", str(WORKBENCH), "--config", str(config), "--out-dir", str(tmp_path / "out")]
    assert cli(argv) == 2
    assert capsys.readouterr().err == (
        "error: setting imports.format: format 'xlsx' is not one of ('parquet', 'csv', 'tsv', 'jsonl')\n"
    )
    assert not (tmp_path / "out").exists()
