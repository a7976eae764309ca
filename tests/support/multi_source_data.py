"""A small data set unlike the LLM-Rubric release (several LLM sources, categorical questions), for end-to-end tests.

Four systems of rising quality; six judges with their own biases; a rubric with a 0..3 main
question (``quality``), a yes/no question (``correct``) and a categorical one (``topic``);
three LLM sources answering every question with their own noise (``llm-c`` mislabels
topics); and a test bank of four self-rating items per text whose per-item blocks are kept
apart (``items.parquet``) for the summary CLI. Probabilities are unnormalised (each block
sums to 0.97).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

RUBRIC = """\
name: multi_source
questions:
  - id: quality
    main: true
    prompt: How good is the answer?
    options:
      - {value: 0, label: poor}
      - {value: 1, label: fair}
      - {value: 2, label: good}
      - {value: 3, label: excellent}
  - id: correct
    prompt: Is the answer correct?
    options: ["yes", "no"]
  - id: topic
    prompt: What is the answer about?
    options: [sports, politics, science]
"""
SYSTEMS = {"S1": -0.9, "S2": -0.3, "S3": 0.3, "S4": 0.9}
TOPICS = ["sports", "politics", "science"]
SOURCES = {"llm-a": 0.3, "llm-b": 0.5, "llm-c": 0.8}  # noise of each source's quality reading
MASS = 0.97


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def write_multi_source_data(dest: str | Path, texts_per_system: int = 45, seed: int = 0) -> dict[str, Path]:
    """Write ``rubric.yaml``, ``annotations.csv``, ``texts.csv``, ``llm_features.parquet`` and
    ``items.parquet`` under ``dest``; returns their paths by stem."""
    rng = np.random.default_rng(seed)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    systems = np.repeat(list(SYSTEMS), texts_per_system)
    n = len(systems)
    text_ids = [f"t{i:03d}" for i in range(n)]
    z = np.array([SYSTEMS[s] for s in systems]) + rng.normal(0, 0.7, n)
    topic = rng.integers(0, 3, n)
    judges = {f"J{j}": b for j, b in enumerate(np.linspace(-0.5, 0.5, 6), start=1)}

    rows = []
    for i, t in enumerate(text_ids):
        for judge in rng.choice(list(judges), 3, replace=False):
            quality = int(np.clip(np.round(1.5 + z[i] + judges[judge] + rng.normal(0, 0.4)), 0, 3))
            correct = "yes" if z[i] + rng.normal(0, 0.5) > 0 else "no"
            label = TOPICS[topic[i]] if rng.random() < 0.85 else TOPICS[rng.integers(0, 3)]
            rows += [(t, judge, "quality", quality), (t, judge, "correct", correct), (t, judge, "topic", label)]
    annotations = pd.DataFrame(rows, columns=["text_id", "judge_id", "question_id", "answer"])

    feats = []
    for source, noise in SOURCES.items():
        reading = z + rng.normal(0, noise, n)
        quality = _softmax(-((np.arange(4)[None, :] - (1.7 + 0.9 * reading[:, None])) ** 2) / 0.8)
        p_yes = 1 / (1 + np.exp(-2.5 * reading))
        seen = np.where(rng.random(n) < (0.6 if source == "llm-c" else 0.9), topic, rng.integers(0, 3, n))
        topics = _softmax(3.0 * np.eye(3)[seen] + rng.normal(0, 0.3, (n, 3)))
        for qid, options, p in (
            ("quality", ["0", "1", "2", "3"], quality),
            ("correct", ["yes", "no"], np.stack([p_yes, 1 - p_yes], 1)),
            ("topic", TOPICS, topics),
        ):
            for i, t in enumerate(text_ids):
                feats += [(t, source, qid, o, MASS * float(p[i, k])) for k, o in enumerate(options)]
    llm_features = pd.DataFrame(feats, columns=["text_id", "source", "question_id", "option", "prob"])

    items = []
    for item in range(4):
        grade = 2.5 + 1.2 * z + rng.normal(0, 0.6, n)
        p = _softmax(-((np.arange(6)[None, :] - grade[:, None]) ** 2) / 1.5)
        for i, t in enumerate(text_ids):
            items += [(t, "bank", f"self_rating:i{item}", str(g), MASS * float(p[i, g])) for g in range(6)]
    item_features = pd.DataFrame(items, columns=["text_id", "source", "question_id", "option", "prob"])

    paths = {
        "rubric": dest / "rubric.yaml",
        "annotations": dest / "annotations.csv",
        "texts": dest / "texts.csv",
        "llm_features": dest / "llm_features.parquet",
        "items": dest / "items.parquet",
    }
    paths["rubric"].write_text(RUBRIC)
    annotations.to_csv(paths["annotations"], index=False)
    pd.DataFrame({"text_id": text_ids, "system_id": systems}).to_csv(paths["texts"], index=False)
    llm_features.to_parquet(paths["llm_features"], index=False)
    item_features.to_parquet(paths["items"], index=False)
    return paths
