"""The real SmolLM2-135M-Instruct (GGUF, fetched by ``make setup``) on 2 dialogues x 2 questions.

The dialogues are short invented enterprise chats (no real data in the repository); the model is
loaded once per session.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from llmrubric.extract import models
from llmrubric.extract.backends.transformers_backend import TransformersBackend
from llmrubric.extract.cache import ResultCache
from llmrubric.extract.families import likert_tasks
from llmrubric.extract.prompts import PromptTemplate
from llmrubric.extract.runner import extract
from llmrubric.rubric import Rubric

pytestmark = pytest.mark.llm
MIN_MASS = 0.05
DIALOGUES = [
    "user: How do I reset my VPN password?\nassistant: Open the self-service portal, choose 'VPN', then "
    "'Reset password'. You will get a code by e-mail [1].\nuser: Thanks, that worked.\nassistant: Glad it helped!",
    "user: What is the travel budget for Q3?\nassistant: I like turtles.\nuser: That does not answer my question.\n"
    "assistant: Budgets are things that companies have.",
]


@pytest.fixture(scope="session")
def smollm2():
    path = models.MODELS_DIR.parents[1] / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make setup` (llmrubric models fetch smollm2 models)")
    import torch

    return models.load(models.resolve(path), torch.float32)


@pytest.fixture(scope="module")
def tasks(rubric):
    two = Rubric.from_dict({"name": "two", "questions": [q for q in rubric.to_dict()["questions"] if q["id"] in ("Q0", "Q1")]})
    texts = pd.DataFrame({"text_id": ["good", "bad"], "text": DIALOGUES})
    tasks, skipped = likert_tasks(texts, two, PromptTemplate("llm_rubric"))
    assert len(tasks) == 4 and not skipped
    return tasks, two


def backend(smollm2, **kwargs) -> TransformersBackend:
    model, tokenizer = smollm2
    return TransformersBackend(model, tokenizer, model_id="smollm2", **kwargs)


@pytest.mark.parametrize("chat", [True, False])
def test_label_mass_above_threshold(smollm2, tasks, chat):
    tasks, rubric = tasks
    b = backend(smollm2, chat_template=chat)
    assert b.answer_prefix == ("" if chat else " ")
    ex = extract(tasks, b, ResultCache(None), "smollm2", (), rubric, progress=False, min_label_mass=MIN_MASS)
    assert ex.summary["done"] == 4 and ex.summary["low_label_mass"] == 0
    assert ex.summary["label_mass_min"] >= MIN_MASS
    sums = ex.features.groupby(["text_id", "question_id"]).prob.sum()
    assert len(sums) == 4 and all(MIN_MASS <= s <= 1 + 1e-6 for s in sums)


def test_low_mass_is_marked(smollm2, tasks):
    """A label prefix the chat format never produces leaves little mass; the blocks are marked."""
    tasks, rubric = tasks
    ex = extract(tasks, backend(smollm2, chat_template=True, label_prefix=" "), ResultCache(None), "s", (), rubric, progress=False, min_label_mass=MIN_MASS)
    assert ex.summary["low_label_mass"] >= 1
    assert set(ex.failures.status) == {"low_label_mass"} and ex.failures.reason.str.contains("below min_label_mass").all()


def test_prefix_reuse_gives_identical_results(smollm2, tasks):
    tasks, _ = tasks
    reuse = {(r.task.text_id, r.task.question_id): r.probs for r in backend(smollm2, chat_template=True, prefix_reuse=True).score(tasks)}
    plain = {(r.task.text_id, r.task.question_id): r.probs for r in backend(smollm2, chat_template=True, prefix_reuse=False).score(tasks)}
    assert reuse.keys() == plain.keys() and len(reuse) == 4
    for key in reuse:
        for option, p in reuse[key].items():
            assert math.isclose(p, plain[key][option], rel_tol=1e-4, abs_tol=1e-7), (key, option)


class Interrupted(Exception):
    pass


def test_killed_run_resumes_without_recomputing(smollm2, tasks, tmp_path):
    """A run interrupted after its first stored result; the rerun computes only the other prompts."""
    tasks, rubric = tasks
    b = backend(smollm2, chat_template=True, batch_size=1, prefix_reuse=False)
    real_score = b.score

    def dies_after_first(todo):
        for n, r in enumerate(real_score(todo)):
            if n == 1:
                raise Interrupted
            yield r

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
    fresh = {(r.task.text_id, r.task.question_id): r.probs for r in backend(smollm2, chat_template=True).score(tasks)}
    again = ex.features.groupby(["text_id", "question_id"]).apply(lambda g: dict(zip(g.option, g.prob)), include_groups=False).to_dict()
    for key, probs in fresh.items():
        assert all(math.isclose(probs[o], again[key][o], rel_tol=1e-4, abs_tol=1e-7) for o in probs)
