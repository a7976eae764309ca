"""Malformed inputs and faults across every entry point, one table row each.

Every case runs an entry point in-process (``llmrubric`` through :func:`llmrubric.cli.main`,
``train.py`` / ``evaluate.py`` through ``runpy`` as ``__main__``, so Hydra parses the
overrides as on the command line) and asserts: exit code 2, a single ``error:`` line naming
what is wrong (file, row, column or setting), no traceback, and no file written or changed
in the case's folder (Hydra's own ``hydra/`` config copy and ``*.log`` included: they are staged and moved
into ``run_dir`` only when the run succeeds).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from safetensors import safe_open
from safetensors.torch import save_file
from support.paths import ROOT
from support.scripts import run_script, snapshot
from support.settings import FAST, FAST_OVERRIDES

from llmrubric.cli import main as cli_main
from llmrubric.extract.testbank import Item, write_bank
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import load_tables
from llmrubric.model.families.network.calibrator import NetworkCalibrator

# its module fixtures are built once: one worker runs the module (make test: --dist loadgroup)
pytestmark = pytest.mark.xdist_group("bad_input")

SIM = ROOT / "data" / "simulated"
FAST_TRAIN = [
    "logger=none",
    *FAST_OVERRIDES,
    "model.ensemble=1",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Valid inputs of every entry point, built once: a small data set, a checkpoint, its
    predictions, a trained run directory, IR and grounded-QA files."""
    w = tmp_path_factory.mktemp("world")
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    texts = pd.read_csv(SIM / "texts.csv", dtype=str).head(40)
    keep = set(texts.text_id)
    ann = pd.read_csv(SIM / "annotations.csv", dtype=str)
    feats = pd.read_csv(SIM / "features.csv", dtype=str)
    texts.to_csv(w / "texts.csv", index=False)
    ann[ann.text_id.isin(keep)].to_csv(w / "ann.csv", index=False)
    feats[feats.text_id.isin(keep)].to_csv(w / "feats.csv", index=False)
    tables = load_tables(w / "ann.csv", w / "feats.csv", rubric, w / "texts.csv")
    model = NetworkCalibrator(rubric, {"ensemble": 1}, FAST, 0).fit(tables)
    model.save(w / "model.safetensors")
    assert (
        cli_main(
            [
                "score",
                "texts",
                str(w / "model.safetensors"),
                str(w / "feats.csv"),
                "--texts",
                str(w / "texts.csv"),
                "--out",
                str(w / "scores.csv"),
                "--predictions",
                str(w / "preds.csv"),
                "--no-progress",
            ]
        )
        == 0
    )
    pd.DataFrame({"system": ["S1", "S2", "S3"], "score": [1.0, 2.0, 3.0]}).to_csv(w / "ref.csv", index=False)
    trained = ["experiment=demo", f"run_dir={w / 'run'}", *FAST_TRAIN, "model.auto.candidates=[network]"]
    assert run_script("train.py", trained) == 0
    # IR: grades, nugget bank, answers and assignments; grounded QA questions, predictions, docs
    pd.DataFrame(
        [("q1", "d1", "i1", 4), ("q1", "d2", "i1", 1), ("q2", "e1", "k1", 5)],
        columns=["query_id", "doc_id", "item_id", "grade"],
    ).to_csv(w / "grades.csv", index=False)
    write_bank([Item("q1", "n1", "nugget", "a", "vital"), Item("q1", "n2", "nugget", "b", "okay")], w / "bank.jsonl")
    pd.DataFrame({"text_id": ["x"], "query_id": ["q1"], "run_id": ["r1"]}).to_csv(w / "answers.csv", index=False)
    pd.DataFrame({"text_id": ["x", "x"], "item_id": ["n1", "n2"], "label": ["support", "partial_support"]}).to_csv(
        w / "assign.csv", index=False
    )
    (w / "questions.jsonl").write_text(
        json.dumps({"doc_id": "doc1", "question": "q?", "answer": "a", "evidence_sentences": ["S1"], "rubric": {}})
        + "\n"
    )
    (w / "gqa_preds.json").write_text(
        json.dumps({"q001": {"answer": "a", "evidence_sentences": ["S1"], "retrieved_docs": ["doc1"]}})
    )
    (w / "docs").mkdir()
    (w / "docs" / "doc1.json").write_text(json.dumps({"sentences": [{"id": "S1", "text": "a b"}]}))
    return w


def table(
    src: Path, dst: Path, change: Callable[[pd.DataFrame], pd.DataFrame] | None = None, suffix: str | None = None
) -> str:
    """Copy a CSV table to ``dst`` (another format by ``suffix``), after ``change``."""
    df = pd.read_csv(src, dtype=str, keep_default_na=False)
    if change is not None:
        df = change(df)
    dst = dst.with_suffix(suffix) if suffix else dst
    if dst.suffix == ".parquet":
        df.to_parquet(dst, index=False)
    else:
        df.to_csv(dst, index=False, sep="\t" if dst.suffix == ".tsv" else ",")
    return str(dst)


def cell(df: pd.DataFrame, row: int, column: str, value) -> pd.DataFrame:
    """``df`` with data row ``row`` (1-based) of ``column`` set to ``value``."""
    df = df.copy()
    df.loc[df.index[row - 1], column] = value
    return df


def copy(world: Path, name: str, d: Path) -> str:
    shutil.copy(world / name, d / name)
    return str(d / name)


def copy_run(world: Path, d: Path) -> Path:
    shutil.copytree(world / "run", d / "run", ignore=shutil.ignore_patterns("hydra", "*.log"))
    return d / "run"


def rewrite_checkpoint(src: Path, dst: Path, tensors_fn=None, meta_fn=None) -> str:
    """Rewrite a checkpoint with changed tensors and/or metadata (the stored checksum kept)."""
    with safe_open(str(src), framework="pt") as f:
        meta = json.loads(f.metadata()["llmrubric"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if tensors_fn:
        tensors_fn(tensors)
    if meta_fn:
        meta_fn(meta)
    save_file(tensors, str(dst), metadata={"llmrubric": json.dumps(meta)})
    return str(dst)


def flip_byte(src: Path, dst: Path) -> str:
    data = bytearray(src.read_bytes())
    data[-7] ^= 0xFF  # inside the last tensor's data
    dst.write_bytes(bytes(data))
    return str(dst)


def nan_weight(tensors):
    name = sorted(k for k in tensors if tensors[k].is_floating_point() and tensors[k].numel())[0]
    tensors[name].view(-1)[0] = float("nan")


def nan_weight_rehashed(src: Path, dst: Path) -> str:
    """A NaN weight with a matching checksum (as a diverged training would have saved it)."""
    from llmrubric.io.integrity import tensors_digest

    def meta_fn(meta):
        meta["tensors_sha256"] = tensors_digest(holder["t"])

    holder = {}

    def tensors_fn(t):
        nan_weight(t)
        holder["t"] = t

    return rewrite_checkpoint(src, dst, tensors_fn, meta_fn)


def other_rubric(meta):
    meta["rubric"]["name"] = "other"
    meta["rubric"]["questions"][-1]["id"] = "Z8"


@dataclass
class Case:
    id: str
    entry: str  # "cli", "train.py" or "evaluate.py"
    make: Callable[[Path, Path], list[str]]  # (world, case folder) → argv / overrides
    needles: tuple[str, ...]  # what the message must name


def score(features=None, **flags):
    """A ``llmrubric score texts`` case: ``features(world, d)`` gives the features path; flags are extra args."""

    def make(w, d):
        ckpt = flags.get("_ckpt")
        args = [
            "score",
            "texts",
            ckpt(w, d) if ckpt else copy(w, "model.safetensors", d),
            features(w, d) if features else copy(w, "feats.csv", d),
        ]
        extra = flags.get("_args", lambda w, d: ["--out", str(d / "out" / "scores.csv")])(w, d)
        return args + extra + ["--no-progress"]

    return make


def feats_case(change, suffix=None):
    return score(lambda w, d: table(w / "feats.csv", d / "feats.csv", change, suffix))


def board(pred_change=None, extra=lambda w, d: []):
    def make(w, d):
        preds = table(w / "preds.csv", d / "preds.csv", pred_change)
        return [
            "leaderboard",
            "build",
            preds,
            "--out-dir",
            str(d / "board"),
            "--bootstrap",
            "5",
            "--no-plot",
            *extra(w, d),
        ]

    return make


def train(*overrides, files=lambda w, d: []):
    return lambda w, d: ["experiment=demo", f"run_dir={d / 'run'}", *FAST_TRAIN, *files(w, d), *overrides]


def evaluate(prepare=lambda w, d, run: [], *overrides):
    def make(w, d):
        run = copy_run(w, d)
        return ["experiment=demo", f"run_dir={run}", "logger=none", *prepare(w, d, run), *overrides]

    return make


def ann_file(change):
    return lambda w, d: [f"data.train.annotations={table(SIM / 'annotations.csv', d / 'ann.csv', change)}"]


def feat_file(change):
    return lambda w, d: [f"data.train.features={table(SIM / 'features.csv', d / 'feats.csv', change)}"]


def block_rows(df, text, question):
    return (df.text_id == text) & (df.question_id == question)


def qrels(change=None, extra=lambda w, d: ["--out", str(d / "qrels.txt")]):
    return lambda w, d: ["ir", "qrels", "--grades", table(w / "grades.csv", d / "grades.csv", change), *extra(w, d)]


def nuggets(*flags):
    return lambda w, d: [
        "ir",
        "nuggets",
        "--answers",
        copy(w, "answers.csv", d),
        "--bank",
        copy(w, "bank.jsonl", d),
        "--assignments",
        copy(w, "assign.csv", d),
        "--out-dir",
        str(d / "nug"),
        *flags,
    ]


def gqa(preds=None, *flags, out=lambda w, d: str(d / "gqa.json")):
    def make(w, d):
        p = d / "gqa_preds.json"
        p.write_text(preds) if preds is not None else shutil.copy(w / "gqa_preds.json", p)
        return [
            "ir",
            "grounded-qa",
            copy(w, "questions.jsonl", d),
            str(p),
            "--docs",
            str(w / "docs"),
            "--no-progress",
            *flags,
            "--out",
            out(w, d),
        ]

    return make


def file_at(d: Path, name: str, text: str) -> str:
    (d / name).write_text(text)
    return str(d / name)


CASES = [
    # features table given to `llmrubric score texts`
    Case(
        "features-missing-prob-column",
        "cli",
        feats_case(lambda df: df.drop(columns="prob")),
        ("feats.csv", "prob", "missing required column"),
    ),
    Case(
        "features-missing-source-column",
        "cli",
        feats_case(lambda df: df.drop(columns="source")),
        ("feats.csv", "source"),
    ),
    Case(
        "features-empty-text-id",
        "cli",
        feats_case(lambda df: cell(df, 3, "text_id", "")),
        ("feats.csv", "row 3", "text_id"),
    ),
    Case("features-empty-option", "cli", feats_case(lambda df: cell(df, 5, "option", "")), ("row 5", "option")),
    Case(
        "features-prob-not-a-number",
        "cli",
        feats_case(lambda df: cell(df, 2, "prob", "abc")),
        ("row 2", "'prob'", "'abc'"),
    ),
    Case(
        "features-prob-negative", "cli", feats_case(lambda df: cell(df, 4, "prob", "-0.1")), ("row 4", "prob", "-0.1")
    ),
    Case("features-prob-inf", "cli", feats_case(lambda df: cell(df, 6, "prob", "inf")), ("row 6", "prob")),
    Case("features-prob-nan-text", "cli", feats_case(lambda df: cell(df, 7, "prob", "nan")), ("row 7", "prob")),
    Case(
        "features-block-sums-over-1",
        "cli",
        feats_case(lambda df: cell(df, 1, "prob", "0.9")),
        ("row 1", "prob", "sum to", "> 1"),
    ),
    Case(
        "features-block-sums-just-over-the-api-tolerance",
        "cli",
        feats_case(
            lambda df: cell(df, 1, "prob", str(float(df.prob[0]) + (1 - sum(map(float, df.prob[:4]))) + 1e-3 + 5e-6))
        ),
        ("row 1", "sum to"),
    ),
    Case(
        "features-option-twice",
        "cli",
        feats_case(lambda df: cell(df, 2, "option", df.option[0])),
        ("option listed twice", "option"),
    ),
    Case(
        "features-option-missing",
        "cli",
        feats_case(lambda df: df.drop(index=3)),
        ("has 3 options", "expected 4", "option"),
    ),
    Case(
        "features-unknown-option",
        "cli",
        feats_case(lambda df: cell(df, 4, "option", "9")),
        ("options", "'9'", "expected 4"),
    ),
    Case(
        "features-no-block-of-the-model",  # a whole question absent is marginalised (issue 34); no shared block is an error
        "cli",
        feats_case(lambda df: df.assign(source="another-llm")),
        ("feats.csv", "share no block", "layout mismatch"),
    ),
    Case(
        "features-unknown-suffix",
        "cli",
        score(lambda w, d: file_at(d, "feats.xlsx", "x")),
        ("feats.xlsx", "unknown table format"),
    ),
    Case("features-file-missing", "cli", score(lambda w, d: str(d / "nope.csv")), ("nope.csv", "not found")),
    Case("features-empty-file", "cli", score(lambda w, d: file_at(d, "feats.csv", "")), ("feats.csv", "empty")),
    Case(
        "features-header-only",
        "cli",
        score(lambda w, d: file_at(d, "feats.csv", "text_id,source,question_id,option,prob\n")),
        ("feats.csv", "empty"),
    ),
    Case(
        "features-garbage-parquet",
        "cli",
        score(lambda w, d: file_at(d, "feats.parquet", "not parquet at all")),
        ("feats.parquet", "cannot be parsed"),
    ),
    Case(
        "features-broken-jsonl",
        "cli",
        score(lambda w, d: file_at(d, "feats.jsonl", '{"text_id": "t1", \n')),
        ("feats.jsonl", "cannot be parsed"),
    ),
    Case(
        "features-parquet-prob-negative",
        "cli",
        feats_case(lambda df: cell(df, 9, "prob", "-1"), ".parquet"),
        ("feats.parquet", "row 9", "prob"),
    ),
    Case(
        "features-tsv-missing-column",
        "cli",
        feats_case(lambda df: df.drop(columns="option"), ".tsv"),
        ("feats.tsv", "option"),
    ),
    # `llmrubric score texts`: settings, outputs, checkpoints
    Case(
        "score-out-is-predictions",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "x.csv"), "--predictions", str(d / "x.csv")]),
        ("--predictions", "x.csv", "same file"),
    ),
    Case(
        "score-out-is-features",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "feats.csv")]),
        ("--out", "input features"),
    ),
    Case(
        "score-predictions-is-checkpoint",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--predictions", str(d / "model.safetensors")]),
        ("--predictions", "checkpoint"),
    ),
    Case(
        "score-summary-is-texts",
        "cli",
        score(_args=lambda w, d: ["--texts", file_at(d, "s.summary.json", "{}"), "--out", str(d / "s.csv")]),
        ("summary", "--texts"),
    ),
    Case(
        "score-out-unknown-format",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.xlsx")]),
        ("--out", "unknown table format", ".xlsx"),
    ),
    Case(
        "score-predictions-unknown-format",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--predictions", str(d / "p.txt")]),
        ("--predictions", ".txt"),
    ),
    Case(
        "score-quantile-2",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--quantile", "2"]),
        ("--quantile", "outside"),
    ),
    Case(
        "score-chunk-texts-0",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--chunk-texts", "0"]),
        ("--chunk-texts", "outside"),
    ),
    Case(
        "score-out-dir-is-a-file",
        "cli",
        score(_args=lambda w, d: ["--out", str(Path(file_at(d, "afile", "x")) / "s.csv")]),
        ("afile", "a file, not a folder"),
    ),
    Case(
        "score-config-bad-yaml",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--config", file_at(d, "c.yaml", "a: [1,\n")]),
        ("c.yaml", "not valid YAML"),
    ),
    Case(
        "score-config-not-a-mapping",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--config", file_at(d, "c.yaml", "- 1\n")]),
        ("c.yaml", "mapping"),
    ),
    Case(
        "score-config-missing",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--config", str(d / "none.yaml")]),
        ("none.yaml", "not found"),
    ),
    Case(
        "score-config-unknown-key",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--config", file_at(d, "c.yaml", "quantlie: 0.5\n")]),
        ("c.yaml", "setting quantlie", "not in 'ScoringConfig'"),
    ),
    Case(
        "score-config-wrong-type",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--config", file_at(d, "c.yaml", "chunk_texts: many\n")]),
        ("c.yaml", "setting chunk_texts", "'many'"),
    ),
    Case(
        "score-texts-missing",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--texts", str(d / "none.csv")]),
        ("none.csv", "not found"),
    ),
    Case(
        "score-unknown-trusted-judge",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--trusted-judges", "NOBODY"]),
        ("NOBODY",),
    ),
    Case(
        "score-unknown-question",
        "cli",
        score(_args=lambda w, d: ["--out", str(d / "s.csv"), "--questions", "Q99"]),
        ("Q99",),
    ),
    Case(
        "checkpoint-missing",
        "cli",
        score(_ckpt=lambda w, d: str(d / "none.safetensors")),
        ("none.safetensors", "not found"),
    ),
    Case(
        "checkpoint-garbage",
        "cli",
        score(_ckpt=lambda w, d: file_at(d, "model.safetensors", "garbage")),
        ("model.safetensors", "not a readable safetensors"),
    ),
    Case(
        "checkpoint-flipped-bytes",
        "cli",
        score(_ckpt=lambda w, d: flip_byte(w / "model.safetensors", d / "m.safetensors")),
        ("m.safetensors", "checksum"),
    ),
    Case(
        "checkpoint-nan-weight",
        "cli",
        score(_ckpt=lambda w, d: rewrite_checkpoint(w / "model.safetensors", d / "m.safetensors", nan_weight)),
        ("m.safetensors", "checksum"),
    ),
    Case(
        "checkpoint-nan-weight-rehashed",
        "cli",
        score(_ckpt=lambda w, d: nan_weight_rehashed(w / "model.safetensors", d / "m.safetensors")),
        ("m.safetensors", "non-finite weights"),
    ),
    Case(
        "checkpoint-old-format",
        "cli",
        score(
            _ckpt=lambda w, d: rewrite_checkpoint(
                w / "model.safetensors",
                d / "m.safetensors",
                meta_fn=lambda m: m.update(format="llmrubric-calibrator/4"),
            )
        ),
        ("m.safetensors", "format"),
    ),
    Case(
        "checkpoint-no-checksum",
        "cli",
        score(
            _ckpt=lambda w, d: rewrite_checkpoint(
                w / "model.safetensors", d / "m.safetensors", meta_fn=lambda m: m.pop("tensors_sha256")
            )
        ),
        ("m.safetensors", "checksum"),
    ),
    Case(
        "checkpoint-metadata-incomplete",
        "cli",
        score(
            _ckpt=lambda w, d: rewrite_checkpoint(
                w / "model.safetensors", d / "m.safetensors", meta_fn=lambda m: m.pop("layout")
            )
        ),
        ("m.safetensors", "layout"),
    ),
    Case(
        "checkpoint-bad-model-setting",
        "cli",
        score(
            _ckpt=lambda w, d: rewrite_checkpoint(
                w / "model.safetensors", d / "m.safetensors", meta_fn=lambda m: m["model"].update(ensemble=0)
            )
        ),
        ("model.ensemble",),
    ),
    # `llmrubric leaderboard build` and `leaderboard correlate`
    Case("leaderboard-unknown-question", "cli", board(extra=lambda w, d: ["--question", "Q99"]), ("--question", "Q99")),
    Case("leaderboard-alpha-2", "cli", board(extra=lambda w, d: ["--alpha", "2"]), ("--alpha", "outside")),
    Case("leaderboard-alpha-0", "cli", board(extra=lambda w, d: ["--alpha", "0"]), ("--alpha",)),
    Case("leaderboard-bootstrap-0", "cli", board(extra=lambda w, d: ["--bootstrap", "0"]), ("--bootstrap",)),
    Case(
        "leaderboard-probabilities-not-summing-to-1",
        "cli",
        board(lambda df: cell(df, 1, "p_1", "0.9")),
        ("preds.csv", "row 1", "sum to"),
    ),
    Case(
        "leaderboard-probability-negative",
        "cli",
        board(lambda df: cell(df, 2, "p_2", "-0.2")),
        ("preds.csv", "row 2", "p_2"),
    ),
    Case(
        "leaderboard-probability-not-a-number",
        "cli",
        board(lambda df: cell(df, 3, "p_3", "x")),
        ("row 3", "p_3", "not a number"),
    ),
    Case("leaderboard-probability-empty", "cli", board(lambda df: cell(df, 4, "p_4", "")), ("row 4", "p_4")),
    Case("leaderboard-missing-mean-column", "cli", board(lambda df: df.drop(columns="mean")), ("preds.csv", "mean")),
    Case("leaderboard-no-system-ids", "cli", board(lambda df: df.drop(columns="system_id")), ("system_id",)),
    Case(
        "leaderboard-unknown-trusted-judge",
        "cli",
        board(extra=lambda w, d: ["--trusted-judges", "NOBODY"]),
        ("NOBODY", "judge_id"),
    ),
    Case(
        "leaderboard-out-dir-is-a-file",
        "cli",
        lambda w, d: [
            "leaderboard",
            "build",
            copy(w, "preds.csv", d),
            "--out-dir",
            file_at(d, "afile", "x"),
            "--no-plot",
        ],
        ("afile", "folder"),
    ),
    Case(
        "leaderboard-out-dir-holds-the-input",
        "cli",
        lambda w, d: [
            "leaderboard",
            "build",
            table(w / "preds.csv", d / "leaderboard.csv"),
            "--out-dir",
            str(d),
            "--no-plot",
        ],
        ("leaderboard.csv", "input predictions"),
    ),
    Case(
        "leaderboard-reference-missing-system",
        "cli",
        board(
            extra=lambda w, d: [
                "--reference",
                table(w / "ref.csv", d / "ref.csv", lambda df: df.head(2)),
                "--texts",
                copy(w, "texts.csv", d),
            ]
        ),
        ("ref.csv", "system"),
    ),
    Case(
        "leaderboard-reference-score-not-a-number",
        "cli",
        board(
            extra=lambda w, d: [
                "--reference",
                table(w / "ref.csv", d / "ref.csv", lambda df: cell(df, 2, "score", "high")),
            ]
        ),
        ("ref.csv", "row 2", "score"),
    ),
    Case(
        "leaderboard-annotations-unknown-question",
        "cli",
        board(
            extra=lambda w, d: [
                "--annotations",
                table(w / "ann.csv", d / "ann.csv", lambda df: cell(df, 6, "question_id", "Q42")),
            ]
        ),
        ("ann.csv", "row 6", "question_id", "Q42"),
    ),
    Case(
        "leaderboard-rubric-missing",
        "cli",
        board(extra=lambda w, d: ["--rubric", str(d / "none.yaml")]),
        ("none.yaml",),
    ),
    Case(
        "rank-correlation-no-score-column",
        "cli",
        lambda w, d: [
            "leaderboard",
            "correlate",
            copy(w, "ref.csv", d),
            table(w / "ref.csv", d / "b.csv", lambda df: df.drop(columns="score")),
        ],
        ("b.csv", "score"),
    ),
    Case(
        "rank-correlation-duplicate-system",
        "cli",
        lambda w, d: [
            "leaderboard",
            "correlate",
            copy(w, "ref.csv", d),
            table(w / "ref.csv", d / "b.csv", lambda df: cell(df, 2, "system", "S1")),
        ],
        ("b.csv", "row 2", "listed twice"),
    ),
    # train.py: settings (checked before Hydra writes anything)
    Case("train-lr-not-a-number", "train.py", train("trainer.lr=abc"), ("trainer.lr", "'abc'")),
    Case("train-lr-zero", "train.py", train("trainer.lr=0"), ("trainer.lr", "outside")),
    Case("train-h1-negative", "train.py", train("model.h1=-5"), ("model.h1", "-5")),
    Case("train-batch-size-zero", "train.py", train("trainer.batch_size=0"), ("trainer.batch_size",)),
    Case(
        "train-batch-size-fraction",
        "train.py",
        train("trainer.batch_size=2.5"),
        ("trainer.batch_size", "not an integer"),
    ),
    Case("train-ensemble-zero", "train.py", train("model.ensemble=0"), ("model.ensemble",)),
    Case("train-input-dropout-1", "train.py", train("model.input_dropout=1"), ("model.input_dropout",)),
    Case("train-val-fraction-1.5", "train.py", train("trainer.val_fraction=1.5"), ("trainer.val_fraction",)),
    Case("train-patience-zero", "train.py", train("trainer.patience=0"), ("trainer.patience",)),
    Case("train-epochs-negative", "train.py", train("trainer.pretrain_epochs=-1"), ("trainer.pretrain_epochs",)),
    Case("train-accelerator-unknown", "train.py", train("trainer.accelerator=tpu9"), ("trainer.accelerator", "'tpu9'")),
    Case("train-inputs-unknown", "train.py", train("model.inputs=words"), ("model.inputs", "'words'")),
    Case("train-personalize-unknown", "train.py", train("model.personalize=maybe"), ("model.personalize",)),
    Case(
        "train-temperature-scaling-not-bool",
        "train.py",
        train("trainer.temperature_scaling=sometimes"),
        ("trainer.temperature_scaling",),
    ),
    Case("train-seed-not-an-integer", "train.py", train("seed=abc"), ("seed", "integer")),
    Case("train-unknown-protocol", "train.py", train("protocol=bogus"), ("protocol", "'bogus'")),
    Case("train-one-fold", "train.py", train("protocol=cv", "folds=1"), ("folds",)),
    Case(
        "train-one-system-group",
        "train.py",
        train("protocol=system_groups", "system_groups=1"),
        ("setting system_groups", "outside"),
    ),
    Case(
        "train-no-grouping-of-the-systems",
        "train.py",
        train("protocol=system_groups", "grouping_seeds=0"),
        ("setting grouping_seeds", "outside"),
    ),
    Case(
        "train-more-system-groups-than-systems",
        "train.py",
        train("protocol=system_groups", "system_groups=9"),
        ("setting system_groups", "9 groups of 4 systems"),
    ),
    Case(
        "train-auto-unknown-candidate",
        "train.py",
        train("model.auto.candidates=[network,forest]"),
        ("setting model.auto.candidates", "'forest'"),
    ),
    Case("train-auto-unknown-rule", "train.py", train("model.auto.rule=vote"), ("setting model.auto.rule", "'vote'")),
    Case(
        "train-unknown-label-objective",
        "train.py",
        train("model.label_rule.objective=f1"),
        ("setting model.label_rule.objective", "'f1'"),
    ),
    Case(
        "train-auto-system-folds-of-one-system",
        "train.py",
        train("model.auto.group=system", "protocol=system_groups", "system_groups=2"),  # 2 training systems
        ("setting model.auto.group", "at least 3 training systems"),
    ),
    Case("train-test-fraction-zero", "train.py", train("test_fraction=0"), ("test_fraction",)),
    Case("train-unknown-main-question", "train.py", train("main_question=Q99"), ("Q99", "main question")),
    Case(
        "train-unknown-predictions-format",
        "train.py",
        train("predictions_format=xlsx"),
        ("predictions_format", "'xlsx'"),
    ),
    Case("train-unknown-baseline", "train.py", train("baselines=[nope]"), ("baselines", "'nope'")),
    Case(
        "train-run-dir-is-a-file",
        "train.py",
        lambda w, d: ["experiment=demo", f"run_dir={file_at(d, 'afile', 'x')}", *FAST_TRAIN],
        ("afile", "run_dir", "not a folder"),
    ),
    Case(
        "train-run-dir-inside-a-file",
        "train.py",
        lambda w, d: ["experiment=demo", f"run_dir={file_at(d, 'afile', 'x')}/run", *FAST_TRAIN],
        ("afile", "not a folder"),
    ),
    # train.py: data (nothing written: no folds.csv, no checkpoint)
    Case(
        "train-answer-not-an-option",
        "train.py",
        train(files=ann_file(lambda df: cell(df, 6, "answer", "7"))),
        ("ann.csv", "row 6", "answer", "'7'"),
    ),
    Case(
        "train-unknown-question-id",
        "train.py",
        train(files=ann_file(lambda df: cell(df, 3, "question_id", "Q42"))),
        ("ann.csv", "row 3", "question_id"),
    ),
    Case(
        "train-conflicting-duplicate",
        "train.py",
        train(
            files=ann_file(
                lambda df: pd.concat(
                    [df, cell(df.head(1), 1, "answer", "1" if df.answer[0] != "1" else "2")], ignore_index=True
                )
            )
        ),
        ("ann.csv", "different answers"),
    ),
    Case(
        "train-annotations-missing-judge-column",
        "train.py",
        train(files=ann_file(lambda df: df.drop(columns="judge_id"))),
        ("ann.csv", "judge_id"),
    ),
    Case(
        "train-annotations-empty-judge",
        "train.py",
        train(files=ann_file(lambda df: cell(df, 8, "judge_id", ""))),
        ("ann.csv", "row 8", "judge_id"),
    ),
    Case(
        "train-every-answer-na",
        "train.py",
        train(files=ann_file(lambda df: df.assign(answer="NA"))),
        ("ann.csv", "answer", "NA"),
    ),
    Case(
        "train-features-missing",
        "train.py",
        train("data.train.features=/nonexistent/f.csv"),
        ("/nonexistent/f.csv", "not found"),
    ),
    Case(
        "train-features-block-over-1",
        "train.py",
        train(files=feat_file(lambda df: cell(df, 2, "prob", "0.99"))),
        ("feats.csv", "row 1", "sum to"),
    ),
    Case(
        "train-features-text-without-features",
        "train.py",
        train(files=feat_file(lambda df: df[df.text_id != "t0002"])),
        ("annotations", "no features", "t0002"),
    ),
    # evaluate.py: checkpoints that do not fit, missing files
    Case(
        "evaluate-no-folds",
        "evaluate.py",
        lambda w, d: ["experiment=demo", f"run_dir={d / 'empty'}", "logger=none"],
        ("folds.csv", "run train.py"),
    ),
    Case(
        "evaluate-stale-checkpoint-beside-new-folds",
        "evaluate.py",
        evaluate(
            lambda w, d, run: (
                pd.read_csv(run / "folds.csv")
                .assign(fold=lambda f: np.roll(f.fold.to_numpy(), 7))
                .to_csv(run / "folds.csv", index=False)
                or []
            )
        ),
        ("fold0.safetensors", "stale checkpoint"),
    ),
    Case(
        "evaluate-checkpoint-of-q3-as-q0",
        "evaluate.py",
        evaluate(
            lambda w, d, run: (
                rewrite_checkpoint(
                    run / "fold0.safetensors", run / "fold0.safetensors", meta_fn=lambda m: m.update(main_question="Q3")
                )
                and []
            )
        ),
        ("fold0.safetensors", "fine-tuned for Q3", "main_question"),
    ),
    Case(
        "evaluate-checkpoint-of-another-rubric",
        "evaluate.py",
        evaluate(
            lambda w, d, run: (
                rewrite_checkpoint(run / "fold0.safetensors", run / "fold0.safetensors", meta_fn=other_rubric) and []
            )
        ),
        ("fold0.safetensors", "rubric 'other'", "setting rubric"),
    ),
    Case(
        "evaluate-corrupt-checkpoint",
        "evaluate.py",
        evaluate(lambda w, d, run: flip_byte(run / "fold0.safetensors", run / "fold0.safetensors") and []),
        ("fold0.safetensors", "checksum"),
    ),
    Case(
        "evaluate-checkpoint-deleted",
        "evaluate.py",
        evaluate(lambda w, d, run: (run / "fold0.safetensors").unlink() or []),
        ("fold0.safetensors", "not found"),
    ),
    Case(
        "evaluate-folds-without-fold-column",
        "evaluate.py",
        evaluate(
            lambda w, d, run: (
                pd.read_csv(run / "folds.csv").drop(columns="fold").to_csv(run / "folds.csv", index=False) or []
            )
        ),
        ("folds.csv", "fold"),
    ),
    Case("evaluate-lr-not-a-number", "evaluate.py", evaluate(lambda w, d, run: ["trainer.lr=abc"]), ("trainer.lr",)),
    Case(
        "evaluate-unknown-predictions-format",
        "evaluate.py",
        evaluate(lambda w, d, run: ["predictions_format=xlsx"]),
        ("predictions_format",),
    ),
    # IR: qrels, nuggets, grounded QA
    Case("qrels-grade-99", "cli", qrels(lambda df: cell(df, 2, "grade", "99")), ("grades.csv", "row 2", "grade", "99")),
    Case("qrels-grade-negative", "cli", qrels(lambda df: cell(df, 3, "grade", "-7")), ("row 3", "grade", "-7")),
    Case(
        "qrels-grade-not-a-number", "cli", qrels(lambda df: cell(df, 1, "grade", "good")), ("row 1", "grade", "'good'")
    ),
    Case(
        "qrels-out-is-grades", "cli", qrels(extra=lambda w, d: ["--out", str(d / "grades.csv")]), ("--out", "--grades")
    ),
    Case(
        "qrels-labels-out-unknown-format",
        "cli",
        qrels(extra=lambda w, d: ["--out", str(d / "q.txt"), "--labels-out", str(d / "l.xlsx")]),
        ("--labels-out", ".xlsx"),
    ),
    Case("nuggets-partial-weight-7", "cli", nuggets("--partial-weight", "7"), ("--partial-weight", "outside")),
    Case("nuggets-partial-weight-negative", "cli", nuggets("--partial-weight", "-1"), ("--partial-weight",)),
    Case(
        "grounded-qa-evidence-as-string",
        "cli",
        gqa(json.dumps({"q001": {"answer": "a", "evidence_sentences": "S1"}})),
        ("gqa_preds.json", "evidence_sentences", "list"),
    ),
    Case(
        "grounded-qa-retrieved-docs-as-string",
        "cli",
        gqa(json.dumps({"q001": {"answer": "a", "retrieved_docs": "doc1"}})),
        ("retrieved_docs", "list"),
    ),
    Case(
        "grounded-qa-docs-folder-missing",
        "cli",
        lambda w, d: gqa()(w, d)[:-2] + ["--docs", str(d / "nodocs"), "--out", str(d / "g.json")],
        ("nodocs", "--docs", "does not exist"),
    ),
    Case("grounded-qa-lambda-2", "cli", gqa(None, "--lambda", "2"), ("--lambda",)),
    Case("grounded-qa-predictions-not-json", "cli", gqa("{not json"), ("gqa_preds.json", "not valid JSON")),
    Case(
        "grounded-qa-out-is-questions",
        "cli",
        gqa(None, out=lambda w, d: str(d / "questions.jsonl")),
        ("--out", "questions"),
    ),
]


def test_the_table_is_large_and_ids_are_unique():
    assert len(CASES) >= 80 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, world, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    args = case.make(world, tmp_path)
    before = snapshot(tmp_path)
    code = cli_main(args) if case.entry == "cli" else run_script(case.entry, args)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, err[-2000:]
    assert "Traceback" not in err and len(errors) == 1, err[-2000:]
    for needle in case.needles:
        assert needle in errors[0], f"{needle!r} not in {errors[0]!r}"
    assert snapshot(tmp_path) == before, "a file was written or changed"
