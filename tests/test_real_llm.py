"""The real SmolLM2-135M-Instruct (GGUF, fetched by ``make setup``) on 2 dialogues x 2 questions.

The dialogues are short invented enterprise chats (no real data in the repository); the model is
loaded once per session (``smollm2`` in conftest.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import assemble, extract, label_mass
from llmrubric.io.rubric import Rubric

# one worker loads SmolLM2 for this module and test_llama_server.py (make test: --dist loadgroup)
pytestmark = [pytest.mark.llm, pytest.mark.xdist_group("smollm2")]
MIN_MASS = 0.05
DIALOGUES = [
    "user: How do I reset my VPN password?\nassistant: Open the self-service portal, choose 'VPN', then "
    "'Reset password'. You will get a code by e-mail [1].\nuser: Thanks, that worked.\nassistant: Glad it helped!",
    "user: What is the travel budget for Q3?\nassistant: I like turtles.\nuser: That does not answer my question.\n"
    "assistant: Budgets are things that companies have.",
]


@pytest.fixture(scope="module")
def tasks(rubric):
    two = Rubric.from_dict(
        {"name": "two", "questions": [q for q in rubric.to_dict()["questions"] if q["id"] in ("Q0", "Q1")]}
    )
    texts = pd.DataFrame({"text_id": ["good", "bad"], "text": DIALOGUES})
    tasks, skipped = likert_tasks(texts, two, PromptTemplate("llm_rubric"))
    assert len(tasks) == 4 and not skipped
    return tasks, two


def backend(smollm2, **kwargs) -> TransformersBackend:
    """Under ``pytest -n N`` on one torch thread (the backend's default, every CPU, left torch spinning two threads
    on the core the other worker uses: each pass several times slower)."""
    model, tokenizer = smollm2
    return TransformersBackend(model, tokenizer, model_id="smollm2", **kwargs)


def probs_of(results) -> dict:
    return {(r.task.text_id, r.task.question_id): r.probs for r in results}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) == 4
    for key in a:
        for option, p in a[key].items():
            assert math.isclose(p, b[key][option], rel_tol=1e-4, abs_tol=1e-7), (key, option)


@pytest.fixture(scope="module")
def chat_run(smollm2, tasks):
    """The shipped defaults: chat template on, prefix reuse on."""
    tasks, rubric = tasks
    b = backend(smollm2, chat_template=True)
    assert b.answer_prefix == ""
    results = list(b.score(tasks))
    return results, assemble(
        tasks, {(r.task.template_hash, r.task.key, r.task.question_id): r for r in results}, "s", (), rubric, MIN_MASS
    )


def test_label_mass_above_threshold_with_chat_template(chat_run):
    results, ex = chat_run
    assert all(r.status == "ok" and label_mass(r) >= MIN_MASS for r in results)
    assert ex.failures.empty and len(ex.features) == 16
    sums = ex.features.groupby(["text_id", "question_id"]).prob.sum()
    assert all(MIN_MASS <= s <= 1 + 1e-6 for s in sums)


def test_label_mass_above_threshold_without_chat_template(smollm2, tasks):
    tasks, rubric = tasks
    b = backend(smollm2, chat_template=False)
    assert b.answer_prefix == " "
    ex = extract(tasks, b, ResultCache(None), "smollm2", (), rubric, progress=False, min_label_mass=MIN_MASS)
    assert ex.summary["done"] == 4 and ex.summary["low_label_mass"] == 0 and ex.summary["label_mass_min"] >= MIN_MASS


def test_blocks_below_the_threshold_are_marked_and_kept(chat_run, tasks):
    results, _ = chat_run
    tasks, rubric = tasks
    lowest = min(label_mass(r) for r in results)
    ex = assemble(
        tasks,
        {(r.task.template_hash, r.task.key, r.task.question_id): r for r in results},
        "s",
        (),
        rubric,
        lowest * 1.0001,
    )
    assert list(ex.failures.status) == ["low_label_mass"] and "below min_label_mass" in ex.failures.reason.iloc[0]
    assert len(ex.features) == 16  # marked, not dropped


def test_prefix_reuse_gives_identical_results(smollm2, tasks, chat_run):
    tasks, _ = tasks
    assert_same(probs_of(chat_run[0]), probs_of(backend(smollm2, chat_template=True, prefix_reuse=False).score(tasks)))


class Interrupted(Exception):
    pass


def test_killed_run_resumes_without_recomputing(smollm2, tasks, chat_run, tmp_path):
    """A run interrupted after its first stored result; the rerun computes only the other prompts."""
    tasks, rubric = tasks
    b = backend(smollm2, chat_template=True, batch_size=1, prefix_reuse=False)
    real_score = b.score

    def dies_after_first(todo):  # killed as the second prompt starts: it is never computed
        yield next(iter(real_score(todo)))
        raise Interrupted

    b.score = dies_after_first
    with pytest.raises(Interrupted):
        extract(tasks, b, ResultCache(tmp_path / "c.sqlite"), "s", (), rubric, progress=False)
    scored = []

    def counting(todo):
        scored.extend(t.key for t in todo)
        return real_score(todo)

    b.score = counting
    cache = ResultCache(tmp_path / "c.sqlite")
    assert cache.count("ok") == 1
    ex = extract(tasks, b, cache, "s", (), rubric, progress=False)
    assert ex.summary["cached"] == 1 and ex.summary["computed"] == 3 and len(scored) == 3 and ex.summary["done"] == 4
    resumed = {(t, q): dict(zip(g.option, g.prob)) for (t, q), g in ex.features.groupby(["text_id", "question_id"])}
    assert_same(probs_of(chat_run[0]), resumed)


def test_release_annotations_with_smollm2_features(shared_root, rubric):
    """`make demo-llm`'s training data: the release's real annotations, SmolLM2's committed features."""
    from llmrubric.data import llm_rubric

    root = Path(__file__).resolve().parents[1]
    smollm2 = llm_rubric.load(shared_root, "real", rubric, features=root / "data" / "real_llm" / "smollm2_real.csv")
    gpt = llm_rubric.load(shared_root, "real", rubric)
    assert set(smollm2.features.source) == {"SmolLM2-135M-Instruct.Q4_1.gguf/llm_rubric"}
    assert set(gpt.features.source) == {"gpt-3.5-turbo-16k"}
    assert set(smollm2.annotations.text_id) <= set(smollm2.features.text_id)
    assert set(smollm2.annotations.text_id) == set(gpt.annotations.text_id)  # both LLMs judged every real dialogue
