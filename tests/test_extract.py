"""Extractor tests on tiny models built from configs (no downloads)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from support.paths import ROOT
from support.tiny_models import make_t5, write_texts

from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import item_tasks, likert_tasks
from llmrubric.extract.prompts import PromptTemplate, text_hash
from llmrubric.extract.runner import extract
from llmrubric.extract.tasks import Task
from llmrubric.extract.testbank import Item
from llmrubric.io.errors import InputError
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import validate_features

RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"


@pytest.fixture(scope="module")
def t5(tok):
    return make_t5(tok)


@pytest.fixture(scope="module")
def rubric():
    return Rubric.load(RUBRIC)


def task(qid, prompt, labels, options=None, group="g", text=""):
    options = tuple(options or labels)
    return Task("t1", qid, prompt, options, tuple(labels), group, "h", text_hash(prompt, *labels), text)


def direct_causal(model, tok, prompt: str, label: str) -> float:
    """p(label | prompt) by one plain forward pass over prompt + label tokens."""
    ids = tok(prompt)["input_ids"]
    full = tok(prompt + label)["input_ids"]
    assert full[: len(ids)] == ids
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits[0].float(), -1)
    return math.exp(sum(float(lp[len(ids) - 1 + j, t]) for j, t in enumerate(full[len(ids) :])))


PROMPTS = [f"Conversation: user: reset password {i}?\nQuestion: how likely{'?' * i}\nAnswer:" for i in range(5)]


@pytest.mark.slow
def test_probabilities_match_direct_softmax(llama, tok):
    backend = TransformersBackend(llama, tok, batch_size=4)
    tasks = [task(f"Q{i}", p, list("1234")) for i, p in enumerate(PROMPTS)]
    results = {r.task.question_id: r for r in backend.score(tasks)}
    for i, p in enumerate(PROMPTS):
        probs = results[f"Q{i}"].probs
        for label in "1234":
            assert probs[label] == pytest.approx(direct_causal(llama, tok, p, " " + label), rel=1e-4, abs=1e-9)
        assert 0 < sum(probs.values()) < 1  # mass outside the options is kept


@pytest.mark.slow
def test_multi_token_labels_are_full_continuations(llama, tok):
    labels = ["Likely.", "Somewhat likely.", "Unlikely.", "Somewhat unlikely."]
    assert any(len(tok(" " + lab, add_special_tokens=False)["input_ids"]) > 2 for lab in labels)
    backend = TransformersBackend(llama, tok, batch_size=3)
    tasks = [task(f"Q{i}", p, labels) for i, p in enumerate(PROMPTS[:3])]
    for r in backend.score(tasks):
        for label in labels:
            assert r.probs[label] == pytest.approx(
                direct_causal(llama, tok, r.task.prompt, " " + label), rel=1e-4, abs=1e-12
            )


def test_labels_that_differ_in_their_last_token_share_one_row(llama, tok):
    labels = ["11", "12", "13", "14"]
    pieces = [tok(" " + label, add_special_tokens=False).input_ids for label in labels]
    assert all(len(p) == 2 for p in pieces) and len({p[0] for p in pieces}) == 1  # " 1" then a digit
    backend = TransformersBackend(llama, tok, batch_size=4)
    t = task("Q0", PROMPTS[0], labels)
    [r] = backend.score([t])
    for label in labels:
        assert r.probs[label] == pytest.approx(direct_causal(llama, tok, PROMPTS[0], " " + label), rel=1e-4, abs=1e-12)
    assert backend.stats["prefill_tokens"] == len(backend.tokens.prepare(t).ids) + 1  # one row: prompt and " 1"


def assert_same_probabilities(one: TransformersBackend, other: TransformersBackend, tasks) -> None:
    """Both backends score every task, with the same probabilities (rel 1e-4)."""
    a = {(r.task.text_id, r.task.question_id): r.probs for r in one.score(tasks)}
    b = {(r.task.text_id, r.task.question_id): r.probs for r in other.score(tasks)}
    assert a.keys() == b.keys() and len(a) == len(tasks)
    for key in a:
        for option in a[key]:
            assert a[key][option] == pytest.approx(b[key][option], rel=1e-4, abs=1e-9)


@pytest.mark.slow
def test_prefix_reuse_equals_no_reuse_and_saves_prefill(llama, tok, rubric, tmp_path):
    texts = pd.read_json(write_texts(tmp_path / "t.jsonl", n=3), lines=True)
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    reuse = TransformersBackend(llama, tok, batch_size=4, prefix_batch_size=4, prefix_reuse=True)
    plain = TransformersBackend(llama, tok, batch_size=4, prefix_reuse=False)
    assert_same_probabilities(reuse, plain, tasks)
    assert reuse.stats["prefill_tokens"] < plain.stats["prefill_tokens"]
    assert plain.stats["prefill_tokens"] == plain.stats["prompt_tokens"]
    assert (
        reuse.stats["prefix_passes"] == 1 and plain.stats["prefix_passes"] == 0
    )  # the 3 texts' prefixes in one padded batch


@pytest.mark.slow
def test_prefixes_run_alone_or_padded_give_the_same_probabilities(llama, tok, rubric, tmp_path):
    texts = pd.read_json(write_texts(tmp_path / "t.jsonl", n=3), lines=True)
    tasks, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    alone = TransformersBackend(llama, tok, batch_size=4, prefix_batch_size=1)
    padded = TransformersBackend(llama, tok, batch_size=4, prefix_batch_size=4)
    assert_same_probabilities(alone, padded, tasks)
    assert (alone.stats["prefix_passes"], padded.stats["prefix_passes"]) == (3, 1)
    assert alone.stats["prefill_tokens"] == padded.stats["prefill_tokens"]


@pytest.mark.parametrize("reuse", [False, True])
@pytest.mark.slow
def test_batching_invariance(llama, tok, reuse):
    labels = ["1", "2", "Somewhat likely."]
    tasks = [task(f"Q{i}", p, labels) for i, p in enumerate(PROMPTS)]
    runs = []
    for batch_size in (1, 3, 16):
        backend = TransformersBackend(llama, tok, batch_size=batch_size, prefix_reuse=reuse)
        runs.append({r.task.question_id: r.probs for r in backend.score(tasks)})
    for other in runs[1:]:
        for qid, probs in runs[0].items():
            for label, p in probs.items():
                assert other[qid][label] == pytest.approx(p, rel=1e-4, abs=1e-12)


@pytest.mark.slow
def test_seq2seq_t5_matches_direct(t5, tok):
    labels = ["1", "2", "Somewhat likely."]
    backend = TransformersBackend(t5, tok, batch_size=2)
    assert backend.seq2seq and not backend.prefix_reuse
    tasks = [task(f"Q{i}", p, labels) for i, p in enumerate(PROMPTS[:3])]
    for r in backend.score(tasks):
        enc = torch.tensor([tok(r.task.prompt)["input_ids"]])
        for label in labels:
            ids = tok(label, add_special_tokens=False)["input_ids"]
            dec = torch.tensor([[t5.config.decoder_start_token_id] + ids[:-1]])
            with torch.no_grad():
                lp = torch.log_softmax(t5(input_ids=enc, decoder_input_ids=dec).logits[0].float(), -1)
            expected = math.exp(sum(float(lp[j, t]) for j, t in enumerate(ids)))
            assert r.probs[label] == pytest.approx(expected, rel=1e-4, abs=1e-12)


@pytest.mark.slow
def test_likert_features_validate_and_mask_citation_blocks(llama, tok, rubric, tmp_path):
    texts = pd.read_json(write_texts(tmp_path / "t.jsonl", n=4), lines=True)
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    assert {s["question_id"] for s in skipped} == {"Q2", "Q3", "Q4", "Q5"}
    assert {s["text_id"] for s in skipped} == {"t1", "t3"}
    ex = extract(
        tasks, TransformersBackend(llama, tok), ResultCache(None), "tiny/llm_rubric", skipped, rubric, progress=False
    )
    validate_features(ex.features, rubric)
    no_refs = ex.features[ex.features.text_id.isin(["t1", "t3"])]
    assert set(no_refs.question_id) == {"Q0", "Q1", "Q6", "Q7", "Q8"}
    assert len(ex.features) == 4 * (2 * 9 + 2 * 5)
    assert (ex.failures.status == "not_applicable").sum() == 8
    assert ex.summary["done"] == 28 and ex.summary["failed"] == 0


@pytest.mark.slow
def test_option_orders_are_rotated_and_averaged(llama, tok, rubric, tmp_path):
    texts = pd.read_json(write_texts(tmp_path / "t.jsonl", n=2), lines=True)
    once, _ = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"), orders=2)
    assert len(tasks) == 2 * len(once) and tasks[0] == once[0]
    first, second = tasks[0], tasks[1]
    assert (first.question_id, first.text_id) == (second.question_id, second.text_id)
    assert second.options == first.options[1:] + first.options[:1]
    assert second.prompt.index("\n2.") < second.prompt.index("\n1.")
    backend = TransformersBackend(llama, tok)
    probs = {t.key: r.probs for t in tasks for r in backend.score([t])}
    ex = extract(tasks, backend, ResultCache(None), "s", skipped, rubric, progress=False)
    assert len(ex.features) == len(
        extract(once, backend, ResultCache(None), "s", skipped, rubric, progress=False).features
    )
    row = (
        ex.features[(ex.features.text_id == first.text_id) & (ex.features.question_id == first.question_id)]
        .set_index("option")
        .prob
    )
    for option in first.options:
        assert row[option] == pytest.approx((probs[first.key][option] + probs[second.key][option]) / 2, rel=1e-5)
    with pytest.raises(InputError, match="orders must be at least 1"):
        likert_tasks(texts, rubric, PromptTemplate("llm_rubric"), orders=0)


@pytest.mark.slow
def test_cache_skips_done_work(llama, tok, rubric, tmp_path):
    texts = pd.read_json(write_texts(tmp_path / "t.jsonl", n=2), lines=True)
    tasks, skipped = likert_tasks(texts, rubric, PromptTemplate("llm_rubric"))
    cache = ResultCache(tmp_path / "c.sqlite")
    first = extract(tasks[:5], TransformersBackend(llama, tok), cache, "s", progress=False)
    assert first.summary["computed"] == 5
    held = extract(tasks, TransformersBackend(llama, tok), cache, "s", skipped, rubric, progress=False, compute=False)
    assert (
        held.summary["cached"] == 5
        and held.summary["computed"] == 0
        and held.features.groupby(["text_id", "question_id"]).ngroups == 5
    )
    assert (held.failures.reason == "no result").sum() == len(tasks) - 5
    backend = TransformersBackend(llama, tok)
    second = extract(tasks, backend, cache, "s", skipped, rubric, progress=False)
    assert second.summary["cached"] == 5 and second.summary["computed"] == len(tasks) - 5
    third = extract(tasks, TransformersBackend(llama, tok), cache, "s", skipped, rubric, progress=False)
    assert third.summary["computed"] == 0
    pd.testing.assert_frame_equal(second.features, third.features)


@pytest.mark.slow
def test_item_families_and_summaries(llama, tok):
    from llmrubric.extract.summaries import summarise

    passages = pd.DataFrame(
        {
            "text_id": ["p1", "p2"],
            "query_id": ["q1", "q1"],
            "query": ["reset a password", "reset a password"],
            "text": ["open the settings page to reset a password.", "the assistant answered."],
        }
    )
    bank = [
        Item.new("q1", "nugget", "settings page resets passwords", "vital"),
        Item.new("q1", "nugget", "password", "okay"),
    ]
    backend = TransformersBackend(llama, tok)
    for family in ("self_rating", "nugget_support"):
        tasks = item_tasks(family, passages, bank)
        assert len(tasks) == 4
        ex = extract(tasks, backend, ResultCache(None), "tiny", progress=False)
        validate_features(ex.features)
        summary = summarise(ex.features, family, {i.item_id: i.importance for i in bank})
        validate_features(summary)
        sums = (
            summary[summary.question_id.str.endswith((".mean", ".max"))].groupby(["text_id", "question_id"]).prob.sum()
        )
        assert sums.to_numpy() == pytest.approx(1.0)
    assert set(summary.question_id) >= {
        "nugget_support.vital_support",
        "nugget_support.all_support",
        "nugget_support.cov_gesupport",
    }
    quality = pd.DataFrame({"text_id": ["a1"], "query_id": ["q1"], "query": ["how?"], "text": ["open settings."]})
    gold = [
        Item.new("q1", "question", "5: correct and cites the settings page; 1: wrong", gold="open the settings page")
    ]
    assert "Gold answer: open the settings page" in item_tasks("answer_quality", quality, gold)[0].prompt


def test_summary_max_under_independence():
    from llmrubric.extract.summaries import summarise

    p = [[0.1, 0.2, 0.7], [0.5, 0.3, 0.2]]
    order = ["not_support", "partial_support", "support"]
    rows = [("t", "s", f"nugget_support:i{i}", o, v * 0.9) for i, d in enumerate(p) for o, v in zip(order, d)]
    out = summarise(
        pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"]), "nugget_support"
    )
    got = out[out.question_id == "nugget_support.max"].set_index("option").prob
    brute = {o: 0.0 for o in order}
    for a in range(3):
        for b in range(3):
            brute[order[max(a, b)]] += p[0][a] * p[1][b]
    for o in order:
        assert got[o] == pytest.approx(brute[o])
    cov = out[out.question_id == "nugget_support.cov_gesupport"].prob.iloc[0]
    assert cov == pytest.approx((0.7 + 0.2) / 2)
    assert "nugget_support.vital_support" not in set(out.question_id)  # no importance: masked, not 0
