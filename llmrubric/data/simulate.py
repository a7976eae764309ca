"""Simulated judges and LLM on the LLM-Rubric rubric: a small, deterministic generative story.

All draws come from ``numpy.random.default_rng(seed)``.

1. Systems S1..S4 differ in mean quality on K=4 latent dimensions (naturalness, grounding,
   concision, efficiency) and in how often their texts show references. A text of system s
   has latent z ~ N(mean_s, I) and references with probability p_s.
2. Each text is annotated on every question by ``judges_per_text`` distinct random judges.
   Question Qi (i >= 1) has the score L_i . z + N(0, 0.6^2) (loadings L in ``truth.json``);
   Q0 (overall satisfaction) has w_j . z / |w_j| + N(0, 0.4^2) with judge j's own weights w_j.
   The answer is the bin of the score among the cut points (-1.5, -0.5, 0.5) shifted by the
   judge's offset (positive = harsh). Q8 (1 fewer turns would do, 2 more needed, 3 reasonable)
   is 3 above the judge's middle cut, else 1 for a verbose text (concision < 0), else 2.
   Texts without references have no human Q2..Q5 rows (NA).
3. The LLM answers every question of every text (options ``Question.llm_options``, 1..4 also
   for Q8). Its mean answer is mu = 2.5 + bias_i + slope_i * (score + N(0, 0.6^2)), where the
   Q0 score uses fixed judge-independent weights and Q2..Q5 of a text without references get
   mu = 1.3 + noise; its probabilities are softmax_k(-(k - mu)^2 / (2 T) + N(0, 0.3^2)) with
   T = 0.6, scaled by a mass Z ~ U(0.97, 1) (unnormalised, like real LLM probabilities).
4. One judge (``truth["idiosyncratic_judge"]``) weights Q0 almost only on concision and is
   harsh: a personalised calibration model should fit that judge far better than a shared one.

:func:`simulate_shift` tells the same story with a system-shift benchmark's settings: many
systems (12 by default) whose general quality spreads evenly over a narrow band except one
much better and one much worse system (beyond the others), several LLM sources with their
own bias, scale (slope), noise and temperature, judges whose cut points are also stretched or
squeezed by their own factor, and less spread of texts around their system's mean. The
embedded demo data (``data/simulated``) is :func:`simulate` with its defaults, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.config import conf_path
from llmrubric.io.errors import InputError
from llmrubric.io.files import json_text, write_folder
from llmrubric.io.rubric import Rubric
from llmrubric.io.rubric_arg import as_rubric
from llmrubric.io.tables import Tables, validate_annotations, validate_features

DEFAULT_RUBRIC = conf_path("rubric", "llm_rubric.yaml")
SOURCE = "simulated-llm"
FILES = ("annotations.csv", "features.csv", "texts.csv", "truth.json")
DIMS = ("naturalness", "grounding", "concision", "efficiency")
SYSTEMS = {  # mean latent quality, probability of showing references
    "S1": ((0.0, -0.8, -0.4, -0.3), 0.3),
    "S2": ((0.3, 0.5, -0.2, 0.0), 0.9),
    "S3": ((0.2, 0.0, 0.6, 0.3), 0.8),
    "S4": ((0.6, 0.8, 0.3, 0.5), 0.95),
}
LOADINGS = {  # Qi score = loadings . z
    "Q1": (1.0, 0.0, 0.0, 0.0),
    "Q2": (0.0, 1.0, 0.0, 0.0),
    "Q3": (0.0, 0.8, 0.0, 0.0),
    "Q4": (0.0, 1.0, 0.0, 0.0),
    "Q5": (0.0, 0.9, 0.0, 0.0),
    "Q6": (0.3, 0.0, 0.8, 0.0),
    "Q7": (0.0, 0.0, 1.0, 0.0),
    "Q8": (0.0, 0.0, 0.3, 0.9),
}
CITATION = ("Q2", "Q3", "Q4", "Q5")
CUTS = np.array([-1.5, -0.5, 0.5])
Q0_WEIGHTS = np.array([0.35, 0.25, 0.2, 0.2])
LLM_Q0_WEIGHTS = np.array([0.45, 0.35, 0.1, 0.1])
IDIOSYNCRATIC = {"q0_weights": [0.05, 0.0, 0.95, 0.0], "offset": 0.9}
NOISE, Q0_NOISE, LLM_NOISE, LOGIT_NOISE, TEMPERATURE = 0.6, 0.4, 0.6, 0.3, 0.6
DEFAULT_SOURCES = (
    {"source": SOURCE, "bias": (0.3, 0.3), "slope": (0.5, 1.0), "noise": LLM_NOISE, "temperature": TEMPERATURE},
)
SHIFT_SOURCES = (  # bias (mean, sd) and slope range per question, noise of the score, softmax temperature
    {"source": "llm-a", "bias": (0.3, 0.3), "slope": (0.5, 1.0), "noise": 0.6, "temperature": 0.6},
    {"source": "llm-b", "bias": (-0.4, 0.3), "slope": (0.3, 0.6), "noise": 0.5, "temperature": 1.0},
    {"source": "llm-c", "bias": (0.6, 0.2), "slope": (0.8, 1.3), "noise": 1.0, "temperature": 0.4},
)
SHIFT = {"band": 0.5, "extreme": 1.6, "dimension_sd": 0.2, "text_sd": 0.6, "judge_spread": 0.2}


def _bins(score: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """1-based ordinal bin of each score among its row of cut points."""
    return 1 + (score[:, None] > cuts).sum(axis=1)


@dataclass(frozen=True)
class _Texts:
    """The drawn texts: ids, system index, latent quality (texts × dimensions), references shown."""

    ids: np.ndarray
    system: np.ndarray
    latent: np.ndarray
    has_refs: np.ndarray


@dataclass(frozen=True)
class _Judges:
    """The drawn judges: ids, cut offsets, Q0 weights, the idiosyncratic judge, cut stretch factors."""

    ids: np.ndarray
    offsets: np.ndarray
    weights: np.ndarray
    odd: int
    spreads: np.ndarray


def simulate(
    seed: int = 0,
    n_texts: int = 300,
    n_judges: int = 12,
    judges_per_text: int = 3,
    rubric: Rubric | str | Path | None = None,
    systems: dict | None = None,
    sources: tuple[dict, ...] = DEFAULT_SOURCES,
    text_sd: float = 1.0,
    judge_spread: float = 0.0,
) -> tuple[Tables, dict]:
    """Simulated canonical tables and the ground truth that generated them (see module doc).

    ``systems``: name → (mean latent quality, probability of references), :data:`SYSTEMS` by
    default; ``sources``: the LLM sources (see :data:`SHIFT_SOURCES`); ``text_sd``: spread of a
    text's latent quality around its system's mean; ``judge_spread``: sd of the log factor by
    which each judge stretches its cut points (0: none drawn)."""
    rubric = as_rubric(DEFAULT_RUBRIC if rubric is None else rubric)
    systems = systems or SYSTEMS
    questions = [f"Q{i}" for i in range(9)]
    _check_settings(rubric, questions, n_texts, n_judges, judges_per_text, sources)
    rng = np.random.default_rng(seed)  # the draws below are taken in this order: texts, judges, humans, LLMs
    texts = _draw_texts(rng, n_texts, systems, text_sd)
    judges = _draw_judges(rng, n_judges, judge_spread)
    system_ids = np.array(list(systems), dtype=object)
    annotations, n_pairs = _human_answers(rng, texts, judges, judges_per_text, questions, system_ids)
    features, llm = _llm_answers(rng, texts, sources, rubric, questions)
    text_table = pd.DataFrame(
        {"text_id": texts.ids, "system_id": system_ids[texts.system], "has_references": texts.has_refs}
    )
    for df, name in ((annotations, "annotations"), (features, "features"), (text_table, "texts")):
        df.index = pd.RangeIndex(1, len(df) + 1)
        df.attrs["source"] = f"<simulated {name}, seed {seed}>"
    tables = Tables(validate_annotations(annotations, rubric), validate_features(features, rubric), text_table)
    sizes = {"texts": n_texts, "judges": n_judges, "judges_per_text": judges_per_text, "annotations": n_pairs}
    return tables, _truth(seed, sizes, systems, system_ids, texts, judges, llm, questions, judge_spread > 0)


def _check_settings(
    rubric: Rubric, questions: list[str], n_texts: int, n_judges: int, judges_per_text: int, sources
) -> None:
    """The rubric is LLM-Rubric's, the sizes fit and every LLM source has its own name."""
    if rubric.ids != questions:
        raise InputError(
            f"the simulator needs the LLM-Rubric questions {questions}, got {rubric.ids}", file=rubric.source
        )
    if not 1 <= judges_per_text <= n_judges or n_texts < 1:
        raise InputError(
            f"need n_texts >= 1 and 1 <= judges_per_text <= n_judges (got {n_texts}, {judges_per_text}, {n_judges})"
        )
    if not sources or len({s["source"] for s in sources}) != len(sources):
        raise InputError(f"need at least one LLM source, each with its own name (got {[s['source'] for s in sources]})")


def _draw_texts(rng: np.random.Generator, n_texts: int, systems: dict, text_sd: float) -> _Texts:
    """Each text's system, latent quality around its system's mean, and whether it shows references."""
    ids = np.array([f"t{i:04d}" for i in range(1, n_texts + 1)], dtype=object)
    system = rng.permutation(np.arange(n_texts) % len(systems))
    means = np.array([m for m, _ in systems.values()])
    latent = means[system] + text_sd * rng.normal(size=(n_texts, len(DIMS)))
    has_refs = rng.random(n_texts) < np.array([p for _, p in systems.values()])[system]
    return _Texts(ids, system, latent, has_refs)


def _draw_judges(rng: np.random.Generator, n_judges: int, judge_spread: float) -> _Judges:
    """Each judge's cut offset and Q0 weights, one idiosyncratic judge, and (with a spread) cut stretch factors."""
    ids = np.array([f"J{j:02d}" for j in range(1, n_judges + 1)], dtype=object)
    offsets = rng.normal(0.0, 0.35, n_judges)
    weights = rng.dirichlet(20 * Q0_WEIGHTS, n_judges)
    odd = int(rng.integers(n_judges))
    offsets[odd], weights[odd] = IDIOSYNCRATIC["offset"], IDIOSYNCRATIC["q0_weights"]
    spreads = np.exp(rng.normal(0.0, judge_spread, n_judges)) if judge_spread > 0 else np.ones(n_judges)
    return _Judges(ids, offsets, weights, odd, spreads)


def _human_answers(
    rng: np.random.Generator,
    texts: _Texts,
    judges: _Judges,
    judges_per_text: int,
    questions: list[str],
    system_ids: np.ndarray,
) -> tuple[pd.DataFrame, int]:
    """The annotations (one row per text, judge and question present) and the number of (text, judge) pairs."""
    n_texts, n_judges = len(texts.ids), len(judges.ids)
    pair_text = np.repeat(np.arange(n_texts), judges_per_text)
    pair_judge = np.concatenate([rng.choice(n_judges, judges_per_text, replace=False) for _ in range(n_texts)])
    z = texts.latent[pair_text]
    cuts = CUTS * judges.spreads[pair_judge][:, None] + judges.offsets[pair_judge][:, None]
    answers = np.zeros((len(pair_text), 9), dtype=int)
    w = judges.weights[pair_judge]
    q0 = (z * w).sum(1) / np.linalg.norm(w, axis=1) + rng.normal(0.0, Q0_NOISE, len(z))
    answers[:, 0] = _bins(q0, cuts)
    for i, q in enumerate(questions[1:], start=1):
        score = z @ np.array(LOADINGS[q]) + rng.normal(0.0, NOISE, len(z))
        answers[:, i] = (
            _bins(score, cuts) if q != "Q8" else np.where(score > cuts[:, 1], 3, np.where(z[:, 2] < 0, 1, 2))
        )
    present = np.ones_like(answers, dtype=bool)
    present[:, 2:6] = texts.has_refs[pair_text][:, None]
    rows, cols = np.nonzero(present)
    annotations = pd.DataFrame(
        {
            "text_id": texts.ids[pair_text[rows]],
            "judge_id": judges.ids[pair_judge[rows]],
            "question_id": np.array(questions)[cols],
            "answer": answers[rows, cols],
            "system_id": system_ids[texts.system[pair_text[rows]]],
        }
    )
    return annotations, len(pair_text)


def _llm_answers(
    rng: np.random.Generator, texts: _Texts, sources, rubric: Rubric, questions: list[str]
) -> tuple[pd.DataFrame, list[dict]]:
    """The features of every LLM source (noisy, biased, judge-independent views of the latent
    scores), sorted by text, question and source, and each source with its drawn bias and slope."""
    blocks, llm = [], []
    for src in sources:
        bias = rng.normal(*src["bias"], 9)
        slope = rng.uniform(*src["slope"], 9)
        llm.append({**src, "bias": bias, "slope": slope})
        for i, q in enumerate(questions):
            blocks.append(_llm_block(rng, texts, src, rubric[q].llm_options, q, bias[i], slope[i]))
    features = pd.concat(blocks, ignore_index=True).sort_values(
        ["text_id", "question_id", "source"], kind="stable", ignore_index=True
    )
    return features, llm


def _llm_block(
    rng: np.random.Generator, texts: _Texts, src: dict, options, q: str, bias: float, slope: float
) -> pd.DataFrame:
    """One source's answer distributions on question ``q`` for every text (6-decimal, unnormalised)."""
    n_texts = len(texts.ids)
    score = texts.latent @ (LLM_Q0_WEIGHTS / np.linalg.norm(LLM_Q0_WEIGHTS) if q == "Q0" else np.array(LOADINGS[q]))
    mu = 2.5 + bias + slope * (score + rng.normal(0.0, src["noise"], n_texts))
    if q in CITATION:
        mu = np.where(texts.has_refs, mu, 1.3 + rng.normal(0.0, 0.3, n_texts))
    k = np.arange(1, len(options) + 1)
    logits = -((k - mu[:, None]) ** 2) / (2 * src["temperature"]) + rng.normal(0.0, LOGIT_NOISE, (n_texts, len(k)))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs *= rng.uniform(0.97, 1.0, n_texts)[:, None] / probs.sum(1, keepdims=True)
    return pd.DataFrame(
        {
            "text_id": np.repeat(texts.ids, len(k)),
            "source": src["source"],
            "question_id": q,
            "option": np.tile(options, n_texts),
            "prob": (np.floor(probs * 1e6) / 1e6).ravel(),
        }
    )


def _truth(
    seed: int,
    sizes: dict,
    systems: dict,
    system_ids: np.ndarray,
    texts: _Texts,
    judges: _Judges,
    llm: list[dict],
    questions: list[str],
    spread_drawn: bool,
) -> dict:
    """``truth.json``: every setting and draw that generated the tables (rounded to 4 decimals)."""
    r = lambda a: np.round(np.asarray(a, dtype=float), 4).tolist()
    n_judges = len(judges.ids)
    return {
        "seed": seed,
        "sizes": sizes,
        "dimensions": list(DIMS),
        "systems": {s: {"mean": r(m), "p_references": r(p)} for s, (m, p) in systems.items()},
        "human": {
            "cuts": CUTS.tolist(),
            "noise": NOISE,
            "q0_noise": Q0_NOISE,
            "loadings": {q: list(v) for q, v in LOADINGS.items()},
        },
        "judges": {
            judges.ids[j]: {"offset": r(judges.offsets[j]), "q0_weights": r(judges.weights[j])} for j in range(n_judges)
        },
        "idiosyncratic_judge": {
            "judge_id": judges.ids[judges.odd],
            "description": "Q0 depends almost only on concision (weight 0.95) and the judge is harsh (cut offset +0.9)",
            "dimension": "concision",
            **IDIOSYNCRATIC,
        },
        **(
            {"llm": _llm_truth(llm[0], questions, r)}
            if len(llm) == 1
            else {"llm_sources": [_llm_truth(src, questions, r) for src in llm]}
        ),
        **({"judge_spreads": {judges.ids[j]: r(judges.spreads[j]) for j in range(n_judges)}} if spread_drawn else {}),
        "texts": {
            t: {"system_id": system_ids[s], "has_references": bool(h), "latent": r(v)}
            for t, s, h, v in zip(texts.ids, texts.system, texts.has_refs, texts.latent)
        },
    }


def _llm_truth(src: dict, questions: list[str], r) -> dict:
    return {
        "source": src["source"],
        "q0_weights": r(LLM_Q0_WEIGHTS),
        "bias": dict(zip(questions, r(src["bias"]))),
        "slope": dict(zip(questions, r(src["slope"]))),
        "noise": src["noise"],
        "logit_noise": LOGIT_NOISE,
        "temperature": src["temperature"],
        "mass": [0.97, 1.0],
    }


def shift_systems(n_systems: int = 12, seed: int = 0) -> dict:
    """Systems of the shift benchmark: general quality evenly over ``±SHIFT["band"]`` for all but
    two, one at ``+SHIFT["extreme"]`` (``S01``, the best) and one at ``-SHIFT["extreme"]`` (``S02``,
    the worst); each dimension's mean is the quality plus N(0, ``dimension_sd``²); references
    shown more often by better systems."""
    if n_systems < 4:
        raise InputError(f"the shift benchmark needs at least 4 systems, got {n_systems}", column="n_systems")
    rng = np.random.default_rng([seed, 1])
    quality = np.concatenate(
        [[SHIFT["extreme"], -SHIFT["extreme"]], np.linspace(-SHIFT["band"], SHIFT["band"], n_systems - 2)]
    )
    means = quality[:, None] + rng.normal(0.0, SHIFT["dimension_sd"], (n_systems, len(DIMS)))
    refs = np.clip(0.75 + 0.15 * quality, 0.3, 0.98)
    return {f"S{i + 1:02d}": (tuple(np.round(m, 4)), round(float(p), 4)) for i, (m, p) in enumerate(zip(means, refs))}


def simulate_shift(
    seed: int = 0,
    n_texts: int = 720,
    n_judges: int = 12,
    judges_per_text: int = 3,
    rubric: Rubric | None = None,
    n_systems: int = 12,
) -> tuple[Tables, dict]:
    """The system-shift benchmark set (module doc): :func:`simulate` with :func:`shift_systems`,
    :data:`SHIFT_SOURCES` and the spreads of :data:`SHIFT`."""
    return simulate(
        seed,
        n_texts,
        n_judges,
        judges_per_text,
        rubric,
        systems=shift_systems(n_systems, seed),
        sources=SHIFT_SOURCES,
        text_sd=SHIFT["text_sd"],
        judge_spread=SHIFT["judge_spread"],
    )


def write_simulated(dest_dir: str | Path, seed: int = 0, shift: bool = False, **kwargs) -> Path:
    """Write the simulated tables (:func:`simulate`, or with ``shift`` :func:`simulate_shift`) and
    ``truth.json`` into ``dest_dir``, all or nothing.

    The files are written as one folder (:func:`~llmrubric.io.files.write_folder`) that then
    replaces ``dest_dir``; a ``dest_dir`` holding other files than these four is refused.
    """
    dest = Path(dest_dir)
    if dest.exists():
        if not dest.is_dir():
            raise InputError("destination exists and is not a directory", file=str(dest))
        other = sorted(p.name for p in dest.iterdir() if p.name not in FILES)
        if other:
            raise InputError(
                f"destination holds other files {other}; choose an empty or simulated-data directory", file=str(dest)
            )
    tables, truth = (simulate_shift if shift else simulate)(seed, **kwargs)
    csv = lambda df: df.to_csv(index=False).encode()
    files = {
        "annotations.csv": csv(tables.annotations.drop(columns="round")),
        "features.csv": csv(tables.features),
        "texts.csv": csv(tables.texts),
        "truth.json": json_text(truth).encode(),
    }
    return write_folder(dest, files)
