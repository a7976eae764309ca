"""The weights of the adaptive stop weighted by the score (docs/extract.md, "Weighted by the score"): what
``llmrubric extract weights`` computes from the simulated pilot and labels, how the extractor reads the file, and
the mistakes in either, each one line and exit 2 with nothing written."""

from __future__ import annotations

import itertools
import json
import logging

import numpy as np
import pandas as pd
import pytest
import yaml
from support.judge_server import judge
from support.paths import ROOT

from llmrubric.cli import main
from llmrubric.extract.backends.generation import ModeSettings
from llmrubric.extract.tolerance_weights import block_spreads, read_weights, score_weights
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables, load_tables

SIM = ROOT / "data" / "simulated"
RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"


@pytest.fixture(scope="module")
def simulated() -> Tables:
    return load_tables(SIM / "annotations.csv", SIM / "features.csv", RUBRIC)


def test_the_main_questions_own_block_weighs_more_than_the_others_on_average_and_the_mean_is_one(tmp_path, capsys):
    out = tmp_path / "w.yaml"
    argv = ["extract", "weights", str(SIM / "features.csv"), str(SIM / "annotations.csv"), "--rubric", str(RUBRIC)]
    assert main([*argv, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"→ {out}")
    weights = yaml.safe_load(out.read_text())
    assert list(weights) == ["simulated-llm"]
    w = weights["simulated-llm"]
    assert set(w) == {f"Q{i}" for i in range(9)} and all(v >= 0 for v in w.values())
    assert np.mean(list(w.values())) == pytest.approx(1, abs=1e-3)  # every question has a block of every text
    assert w["Q0"] > 1.5 * np.mean([v for q, v in w.items() if q != "Q0"])
    assert min(w.values()) < 0.1 < 1.5 < max(w.values())  # the blocks weigh very unequally


def test_blocks_of_categories_weigh_one_and_the_mean_over_the_blocks_is_one(simulated):
    feats = simulated.features
    categories = feats[feats.question_id == "Q3"].assign(source="cat", option=lambda f: "o" + f.option.astype(str))
    few = feats[(feats.question_id == "Q1") & feats.text_id.isin(feats.text_id.unique()[:50])].assign(source="few")
    tables = Tables(simulated.annotations, pd.concat([feats, categories, few], ignore_index=True), simulated.texts)
    weights = score_weights(tables, Rubric.load(RUBRIC))
    assert weights["cat"] == {"Q3": 1.0}
    blocks = block_spreads(tables.features)
    per_block = [weights[s][q] for s, q in zip(blocks.source, blocks.question_id)]
    assert np.mean(per_block) == pytest.approx(1.0)
    assert np.mean(list(weights["simulated-llm"].values())) != pytest.approx(1.0)  # the 50 texts of "few" count less


def test_a_main_question_without_labels_is_an_error_naming_it(simulated):
    tables = Tables(simulated.annotations[simulated.annotations.question_id != "Q0"], simulated.features, None)
    with pytest.raises(InputError, match="the main question 'Q0' has no numeric human answer"):
        score_weights(tables, Rubric.load(RUBRIC))


def write(path, data) -> str:
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_the_extractor_reads_its_sources_weights_and_a_missing_question_weighs_one_with_a_warning(tmp_path, caplog):
    path = write(tmp_path / "w.yaml", {"judge:sampled": {"Q0": 4, "Q1": 0.25}, "other": {"Q0": 1}})
    with caplog.at_level(logging.WARNING):
        assert read_weights(path, "judge:sampled", ["Q0", "Q1", "Q2"]) == {"Q0": 4.0, "Q1": 0.25, "Q2": 1.0}
    assert "no weight of source 'judge:sampled' for questions Q2: they weigh 1" in caplog.text
    with pytest.raises(InputError, match=r"w.yaml: no weights of source 'gpt'; the file holds \['judge:sampled', 'oth"):
        read_weights(path, "gpt", ["Q0"])
    with pytest.raises(InputError, match="question 'Q1': weight -1 is not a number >= 0"):
        read_weights(write(tmp_path / "bad.yaml", {"s": {"Q0": 1, "Q1": -1}}), "s", ["Q0"])
    with pytest.raises(InputError, match=r"expected \{source: \{question_id: weight\}\}"):
        read_weights(write(tmp_path / "list.yaml", [1, 2]), "s", ["Q0"])


def without_main(d):
    ann = pd.read_csv(SIM / "annotations.csv")
    ann[ann.question_id != "Q0"].to_csv(d / "a.csv", index=False)
    return d / "a.csv"


def with_an_unfeatured_text(d):
    ann = pd.read_csv(SIM / "annotations.csv")
    pd.concat([ann, ann.head(1).assign(text_id="no-features")]).to_csv(d / "a.csv", index=False)
    return d / "a.csv"


@pytest.mark.parametrize(
    "annotations, out, message",
    [
        (with_an_unfeatured_text, "w.yaml", "text 'no-features'); add --drop-unfeatured to leave them out"),
        (without_main, "w.yaml", "a.csv: the main question 'Q0' has no numeric human answer to weigh the blocks by"),
        (lambda d: SIM / "annotations.csv", "w.json", "w.json, setting --out: the weights file is YAML"),
        (lambda d: SIM / "features.csv", "w.yaml", "features.csv"),
    ],
    ids=["text-without-features", "main-question-unlabelled", "out-not-yaml", "features-as-annotations"],
)
def test_bad_input_to_the_weights_command_is_one_line_and_writes_nothing(tmp_path, capsys, annotations, out, message):
    ann = annotations(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = ["extract", "weights", str(SIM / "features.csv"), str(ann), "--rubric", str(RUBRIC)]
    assert main([*argv, "--out", str(tmp_path / out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_weights_command_leaves_out_the_texts_without_features_when_told(tmp_path, capsys):
    argv = ["extract", "weights", str(SIM / "features.csv"), str(with_an_unfeatured_text(tmp_path))]
    assert main([*argv, "--rubric", str(RUBRIC), "--out", str(tmp_path / "w.yaml"), "--drop-unfeatured"]) == 0
    assert yaml.safe_load((tmp_path / "w.yaml").read_text())


def alternating_judge():
    """A judge's reply: 1, 2, 1, 2, … (an undecided judge, spread 0.5 on every question)."""
    answers = itertools.cycle("12")
    return lambda prompt: {"role": "assistant", "content": next(answers)}


def weighted_run(tmp_path, url: str, weights: dict, *extra: str) -> list[str]:
    """``extract features`` argv of two demo texts, sampled with an adaptive stop at tolerance 0.1, one answer a
    request and one request at a time, source ``judge``, the tolerance weights ``weights``."""
    pd.read_csv(ROOT / "data" / "demo_llm" / "texts.csv").head(2).to_csv(tmp_path / "t.csv", index=False)
    argv = ["extract", "features", str(tmp_path / "t.csv"), "--config", str(ROOT / "conf" / "extract" / "openai.yaml")]
    argv += ["--out", str(tmp_path / "f.csv"), "--mode", "sampled", "--samples", "20", "--samples-per-request", "1"]
    argv += ["--tolerance", "0.1", "--concurrency", "1", "--source", "judge", "--no-progress"]
    argv += ["--tolerance-weights", write(tmp_path / "w.yaml", weights)]
    return [*argv, "--set", f"base_url={url}", "--set", "api_key_env=null", *extra]


def test_a_heavier_block_gets_more_answers_from_the_same_judge_and_a_lighter_one_fewer(tmp_path, capsys, caplog):
    with judge(alternating_judge()) as url, caplog.at_level(logging.WARNING):
        assert main(weighted_run(tmp_path, url, {"judge": {"Q0": 4, "Q1": 0.25}, "other": {"Q0": 0}})) == 0
    samples = pd.read_csv(tmp_path / "f.csv").groupby(["text_id", "question_id"]).samples.first().unstack()
    assert (samples["Q0"] == 20).all()  # spread 0.5 / (0.1 / 4) = 20 answers, the most
    assert (samples["Q1"] == 2).all()  # 0.5 / (0.1 / 0.25) < 2: the fewest
    unweighted = samples.drop(columns=["Q0", "Q1"])
    assert ((unweighted > 2) & (unweighted < 20)).all().all()  # about 0.5 / 0.1: weight 1, with a warning
    assert "no weight of source 'judge' for questions Q2, Q3, Q4, Q5, Q6, Q7, Q8: they weigh 1" in caplog.text


def test_the_weights_enter_the_cache_key_only_when_set_and_a_dry_run_reads_them(tmp_path, capsys):
    plain = ModeSettings("sampled", tolerance=0.1)
    weighted = ModeSettings("sampled", tolerance=0.1, tolerance_weights={"Q0": 4.0})
    assert "tolerance_weights" not in plain.key() and '"tolerance_weights": [["Q0", 4.0]]' in weighted.key()
    assert weighted.block_tolerance("Q0") == 0.025 and weighted.block_tolerance("Q9") == plain.block_tolerance("Q0")
    assert ModeSettings("sampled", tolerance=0.1, tolerance_weights={"Q0": 0}).block_tolerance("Q0") == float("inf")
    with pytest.raises(InputError, match="extract setting tolerance_weights: .* with a tolerance"):
        ModeSettings("sampled", tolerance_weights={"Q0": 4.0})
    argv = weighted_run(tmp_path, "http://127.0.0.1:9/v1", {"judge": {"Q0": 4}}, "--dry-run")
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["judge"]["blocks"] == 18
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "w.yaml"]


@pytest.mark.parametrize(
    "weights, extra, message",
    [
        ({"gpt": {"Q0": 2}}, [], "w.yaml: no weights of source 'judge'; the file holds ['gpt']"),
        ({"judge": {"Q0": "heavy"}}, [], "w.yaml: source 'judge', question 'Q0': weight 'heavy' is not a number >= 0"),
        ({"judge": {"Q0": 2}}, ["--mode", "verbalized"], "setting tolerance_weights: tolerance_weights go with"),
    ],
    ids=["source-missing", "weight-not-a-number", "mode-without-a-stop"],
)
def test_bad_tolerance_weights_are_one_line_and_nothing_is_asked_or_written(tmp_path, capsys, weights, extra, message):
    with judge(alternating_judge()) as url:
        assert main(weighted_run(tmp_path, url, weights, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "w.yaml"]
