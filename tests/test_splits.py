import pytest

from llmrubric.errors import InputError
from llmrubric.splits import holdout_texts, text_folds


def test_folds_partition_texts_evenly_and_deterministically():
    texts = [f"t{i}" for i in range(23)] * 3
    folds = text_folds(texts, 5, seed=1)
    assert sorted(folds.text_id) == sorted(set(texts))
    assert folds.fold.value_counts().max() - folds.fold.value_counts().min() <= 1
    assert folds.equals(text_folds(texts, 5, seed=1))
    assert not folds.equals(text_folds(texts, 5, seed=2))


def test_holdout_is_disjoint():
    kept, held = holdout_texts([f"t{i}" for i in range(10)], 0.3, seed=0)
    assert len(held) == 3 and not set(kept) & set(held) and len(kept) + len(held) == 10
    with pytest.raises(InputError):
        text_folds(["a"], 5, 0)
