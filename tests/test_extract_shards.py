"""Extraction shards: ``--shard K/N`` and ``--shards N`` jobs launched through submitit's local
executor (Slurm on a cluster: ``--launcher slurm``), on a tiny saved Llama."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
import pytest
from support.tiny_models import save_model

from llmrubric.cli import main
from llmrubric.extract.shards import parse_shard, shard_of
from llmrubric.io.errors import InputError
from llmrubric.io.tables import read_raw, read_table

pytest.importorskip("submitit", reason="submitit is not installed (pip install -e '.[scale]')")
REFS = "user: how do I reset my password? assistant: open the settings page [1].\nSources: [1] the settings page."
PLAIN = "user: how do I reset my password? assistant: open the settings page and choose a new one."


def rubric_yaml(second: int) -> str:
    """Q0 for every text; Q1 only for texts with references, its options (the LLM's labels) 1 and ``second``."""
    return (
        "questions:\n"
        "  - {id: Q0, main: true, prompt: 'How good is the answer?', options: [1, 2, 3, 4]}\n"
        "  - id: Q1\n    applicable_if: has_references\n    prompt: 'Are the references used?'\n"
        f"    options: [1, {second}]\n"
    )


@pytest.fixture
def setup(tmp_path, llama, tok):
    """A model folder, two rubrics (``12`` begins with the tokens of ``1``: the backend refuses
    Q1) and texts whose references all lie in shard 1 of 2, so only that shard asks Q1."""
    ids = [f"t{i}" for i in range(40)]
    plain = [i for i in ids if shard_of(i, 2) == 0][:3]
    refs = [i for i in ids if shard_of(i, 2) == 1][:3]
    rows = [{"text_id": i, "text": f"{PLAIN} ({i})"} for i in plain] + [
        {"text_id": i, "text": f"{REFS} ({i})"} for i in refs
    ]
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "good.yaml").write_text(rubric_yaml(2))
    (tmp_path / "bad.yaml").write_text(rubric_yaml(12))
    model = save_model(llama, tok, tmp_path / "model")
    return tmp_path, texts, model


def argv(texts, model, rubric, out, *more):
    return [
        "extract",
        "features",
        str(texts),
        "--rubric",
        str(rubric),
        "--model",
        str(model),
        "--out",
        str(out),
        "--min-label-mass",
        "0",
        "--no-progress",
        *more,
    ]


def outputs(out):
    summary = json.loads(out.with_name(out.stem + ".summary.json").read_text())
    return read_table(out, "features"), read_raw(out.with_name(out.stem + ".failures" + out.suffix)), summary


def test_partition_is_stable_complete_and_disjoint():
    ids = [f"text-{i}" for i in range(2000)]
    for n in (1, 2, 7):
        shards = [shard_of(i, n) for i in ids]
        assert set(shards) == set(range(n))  # complete: every id in exactly one shard 0 … n-1
        assert shards == [shard_of(i, n) for i in ids]
    counts = pd.Series([shard_of(i, 7) for i in ids]).value_counts()
    assert counts.min() > 2000 / 7 * 0.8  # spread evenly by the hash, not by position
    assert parse_shard("1/2") == (1, 2) and parse_shard("0/1") == (0, 1)
    for bad in ("3/2", "2/2", "x", "1", "1/0", "a/b", "-1/2"):
        with pytest.raises(InputError, match="--shard: expected K/N"):
            parse_shard(bad)


def test_merge_keeps_final_results_and_filters_texts(tmp_path):
    from llmrubric.extract.cache import ResultCache
    from llmrubric.extract.tasks import Result, Task

    def result(text_id, status):
        task = Task(text_id, "Q0", f"prompt {text_id}", ("1", "2"), ("1", "2"), text_id, "h", f"key-{text_id}")
        return Result(task, {"1": 0.25, "2": 0.75} if status == "ok" else None, status, "" if status == "ok" else "x")

    main, other = ResultCache(tmp_path / "main.sqlite"), ResultCache(tmp_path / "other.sqlite")
    for text_id, here, there in (("a", "ok", "failed"), ("b", "failed", "ok"), ("c", None, "ok"), ("d", None, "ok")):
        if here:
            main.put("m", result(text_id, here))
        other.put("m", result(text_id, there))
    other.close()
    assert main.merge(tmp_path / "other.sqlite", keep=lambda text_id: text_id != "d") == 2
    status = dict(main.db.execute("SELECT text_id, status FROM results").fetchall())
    assert status == {"a": "ok", "b": "ok", "c": "ok"}  # a final result is never replaced; d filtered out
    assert main.merge(tmp_path / "other.sqlite", keep=lambda text_id: text_id != "d") == 0  # nothing twice


@pytest.mark.parametrize("value", ["3/2", "x"])
def test_bad_shard_is_one_line_error(setup, value, capsys):
    tmp, texts, model = setup
    assert main(argv(texts, model, tmp / "good.yaml", tmp / "f.csv", "--shard", value)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--shard" in err and repr(value) in err
    assert not list(tmp.glob("f*"))


@pytest.mark.slow
def test_one_shard_is_its_texts_of_a_one_process_run(setup):
    tmp, texts, model = setup
    assert main(argv(texts, model, tmp / "good.yaml", tmp / "all.csv")) == 0
    full = outputs(tmp / "all.csv")[0]
    parts = []
    for k in (0, 1):
        assert main(argv(texts, model, tmp / "good.yaml", tmp / f"s{k}.csv", "--shard", f"{k}/2")) == 0
        features, _, summary = outputs(tmp / f"s{k}.csv")
        assert {shard_of(t, 2) for t in features.text_id} == {k} and summary["computed"] == summary["prompts"]
        assert (tmp / f"s{k}.csv.cache.sqlite").exists()  # its own cache, as without --shard
        parts.append(features)
    together = pd.concat(parts).sort_values(["text_id", "question_id", "option"], ignore_index=True)
    pd.testing.assert_frame_equal(together, full.sort_values(["text_id", "question_id", "option"], ignore_index=True))


@pytest.mark.slow
def test_shard_jobs_fail_resume_and_match_one_process_run(setup, capsys):
    tmp, texts, model = setup
    assert main(argv(texts, model, tmp / "good.yaml", tmp / "one.parquet")) == 0
    one = outputs(tmp / "one.parquet")
    out = tmp / "f.parquet"
    cache = tmp / "f.parquet.cache.sqlite"

    # shard 1's job fails (its texts alone ask Q1, whose labels the backend refuses): one line, nothing final
    capsys.readouterr()
    assert main(argv(texts, model, tmp / "bad.yaml", out, "--shards", "2")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "1 of 2 shard jobs failed: shard 1/2:" in err and "collide" in err
    log = err.split("log ")[1].split(")")[0]
    assert log.endswith(".err") and "collide" in open(log).read() and str(tmp / "f.parquet.jobs") in log
    assert not [p.name for p in tmp.glob("f.*") if p.name not in ("f.parquet.cache.sqlite", "f.parquet.jobs")]
    kept = sqlite3.connect(cache).execute("SELECT text_id, status FROM results").fetchall()
    assert {shard_of(t, 2) for t, _ in kept} == {0} and len(kept) == 3 and {s for _, s in kept} == {"ok"}

    # the rerun computes only what shard 0 did not; its outputs are the one-process run's
    assert main(argv(texts, model, tmp / "good.yaml", out, "--shards", "2")) == 0
    features, failures, summary = outputs(out)
    pd.testing.assert_frame_equal(features, one[0], rtol=1e-6)  # float32 sums of other batches: last bits
    pd.testing.assert_frame_equal(failures, one[1])
    assert summary["cached"] == 3 and summary["computed"] == one[2]["prompts"] - 3
    for key in ("prompts", "done", "failed", "not_applicable", "label_mass_median"):
        assert summary[key] == pytest.approx(one[2][key], rel=1e-6)
    rows = sqlite3.connect(cache).execute("SELECT COUNT(*), COUNT(DISTINCT key || question_id) FROM results")
    assert rows.fetchone() == (one[2]["prompts"],) * 2  # every result once, none lost
    assert not list(tmp.glob("f.parquet.cache.shard-*"))  # shard caches merged and removed
    assert len(list((tmp / "f.parquet.jobs").glob("*_log.err"))) == 4


@pytest.mark.slow
def test_launcher_settings_are_checked_before_any_work(setup, capsys):
    tmp, texts, model = setup
    out = tmp / "f.csv"
    for more, says in (
        (["--launcher-set", "+bogus=1"], "bogus"),
        (["--launcher", "slurm"], "srun"),  # no Slurm on this machine
        (["--launcher", str(tmp / "none.yaml")], "not found"),
    ):
        assert main(argv(texts, model, tmp / "good.yaml", out, "--shards", "2", *more)) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and says in err, err
    assert main(argv(texts, model, tmp / "good.yaml", out, "--launcher", "local")) == 2
    assert "go with --shards" in capsys.readouterr().err
    assert main(argv(texts, model, tmp / "good.yaml", out, "--shards", "2", "--shard", "0/2")) == 2
    assert not [p for p in tmp.glob("f.*") if p.name != "f.csv.jobs"]
