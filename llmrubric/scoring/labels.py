"""Few human labels, most information: PPI and PPI++ system means, and which texts to label next.

With k human labels of a system's texts and the calibrated judge-free score f of all its texts,
the system's human mean has three intervals from the reference library ``ppi_py``
(Angelopoulos et al. 2023, 2024): ``classical`` (the labels alone), ``ppi`` (the mean of f
corrected by the labelled texts' mean residual Y − f, λ = 1) and ``ppi_pp`` (power-tuned:
Y − λf with the variance-minimising λ ∈ [0, 1], so never worse than the labels alone, up
to noise in λ). They assume the labelled texts are a uniform random sample.

Active labelling (Zrnic & Candès 2024) draws the k texts instead, with replacement, with
probabilities q_i that grow with the model's predictive uncertainty (the square root of the
trusted judges' mean predicted variance: the standard deviation of the residual of a calibrated
model), mixed with the uniform distribution by a ``floor`` so every text can be drawn.
``active_ppi_pp`` is then the inverse-probability-weighted PPI++ estimate over the k draws, with
weights w ∝ 1/(N q) normalised to mean 1 (the self-normalised, Hájek form, as ppi_py's ``w=``):
θ̂ = λ·mean_N f + Σ w (Y − λf) / Σ w. Its variance, λ²·var f / N + mean(w² (Ỹ − λf̃)²) / k with Ỹ,
f̃ centred at their weighted means, is the linearised one, so a constant bias of the model costs
no width (ppi_py's weighted interval uses the uncentred w·(Y − λf), which charges for it, and its
λ rule assumes unweighted samples): this estimator is therefore written here, with the λ ∈ [0, 1]
that minimises that variance. With uniform q it equals ppi_py's ``ppi_mean_ci`` over all N texts
(a test checks it).
Labels may arrive in rounds, each drawn with its own probabilities: each draw's weighted terms
w·(Y − λf) and w have the same expectations (the system's mean residual, and 1) whatever its
round's q, so the draws of all rounds are pooled.

Every interval is normal (z) with the library's variance convention (ddof 0); ``small_sample:
student`` widens each by t_{k−1}/z · sqrt(k/(k−1)) (Student's interval with Bessel's correction),
which the library leaves out and which matters for k ≤ 20.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from llmrubric.io.errors import InputError
from llmrubric.io.rows import check_unique
from llmrubric.io.tables import source_of

UNIFORM = ("classical", "ppi", "ppi_pp")
METHODS = (*UNIFORM, "active_ppi_pp")
DESCRIPTIONS = {
    "classical": "mean of the k human labels alone, normal interval (ppi_py.classical_mean_ci)",
    "ppi": "prediction-powered mean, lambda = 1 (ppi_py.ppi_mean_ci, lam=1)",
    "ppi_pp": "power-tuned prediction-powered mean, PPI++ (ppi_py.ppi_mean_ci, lam tuned)",
    "active_ppi_pp": "PPI++ with inverse-probability weights of actively sampled labels (llmrubric.scoring.labels.active_ppi_pp)",
}
SAMPLING_COLUMNS = ["text_id", "system_id", "round", "prob", "draws", "uncertainty"]


def ppi_py():
    """The ``ppi_py`` module, imported without its process-wide ``warnings.simplefilter("ignore")``."""
    with warnings.catch_warnings():
        import ppi_py as module
    return module


def _result(estimate: float, low: float, high: float, n: int, alpha: float, small_sample: str) -> dict:
    """Estimate and interval as a dict, widened to Student's interval when ``small_sample == "student"``."""
    half = (high - low) / 2
    if small_sample == "student" and n >= 2:
        z = stats.norm.ppf(1 - alpha / 2)
        half *= stats.t.ppf(1 - alpha / 2, n - 1) / z * math.sqrt(n / (n - 1))
    elif small_sample not in ("student", "normal"):
        raise InputError(f"{small_sample!r} is not student or normal", setting="small_sample")
    return {"estimate": float(estimate), "low": float(estimate - half), "high": float(estimate + half)}


def nan_result() -> dict:
    return {"estimate": math.nan, "low": math.nan, "high": math.nan}


def uniform_interval(
    method: str,
    labels: np.ndarray,
    labelled_f: np.ndarray,
    unlabelled_f: np.ndarray,
    alpha: float = 0.05,
    small_sample: str = "student",
) -> dict:
    """``classical``, ``ppi`` or ``ppi_pp`` interval of a mean from uniformly drawn labels (ppi_py).

    ``labels`` and ``labelled_f``: human labels and scores of the k labelled texts;
    ``unlabelled_f``: scores of the others. Fewer than 2 labels: NaN. With fewer than 2 unlabelled
    texts every method is the classical mean."""
    labels, labelled_f, unlabelled_f = (np.asarray(a, float) for a in (labels, labelled_f, unlabelled_f))
    n = len(labels)
    if n < 2:
        return nan_result()
    lib = ppi_py()
    if method == "classical" or len(unlabelled_f) < 2:
        low, high = lib.classical_mean_ci(labels, alpha=alpha)
        return _result(labels.mean(), float(low), float(high), n, alpha, small_sample)
    if method not in UNIFORM:
        raise ValueError(f"method must be one of {UNIFORM}, not {method!r}")
    lam = 1.0 if method == "ppi" else None
    low, high = lib.ppi_mean_ci(labels, labelled_f, unlabelled_f, alpha=alpha, lam=lam)
    low, high = float(np.ravel(low)[0]), float(np.ravel(high)[0])
    # ppi_py's interval is symmetric about its point estimate
    return _result((low + high) / 2, low, high, n, alpha, small_sample)


def active_ppi_pp(
    labels: np.ndarray,
    labelled_f: np.ndarray,
    probs: np.ndarray,
    all_f: np.ndarray,
    alpha: float = 0.05,
    lam: float | None = None,
    small_sample: str = "student",
) -> dict:
    """Inverse-probability-weighted PPI++ mean (module doc) from k draws with replacement.

    ``labels``, ``labelled_f``, ``probs``: label, score and per-draw probability q of each draw
    (a text drawn twice appears twice); ``all_f``: the scores of all N texts the draws came from.
    ``lam`` fixes λ (1: PPI, 0: the weighted labels alone); None tunes it. Returns
    ``estimate, low, high, lam``."""
    y, f, q, all_f = (np.asarray(a, float) for a in (labels, labelled_f, probs, all_f))
    k, big_n = len(y), len(all_f)
    if k < 2 or big_n < 1:
        return {**nan_result(), "lam": math.nan}
    w = 1.0 / (big_n * q)
    w = w / w.mean()
    var_f = all_f.var() / big_n
    yc = y - np.sum(w * y) / np.sum(w)  # centred at their weighted means: a constant bias costs nothing
    fc = f - np.sum(w * f) / np.sum(w)
    if lam is None:
        denom = var_f + np.mean((w * fc) ** 2) / k
        lam = float(np.clip(np.mean(w * yc * w * fc) / k / denom, 0.0, 1.0)) if denom > 0 else 0.0
    estimate = lam * all_f.mean() + np.sum(w * (y - lam * f)) / np.sum(w)
    se = math.sqrt(lam**2 * var_f + np.mean((w * (yc - lam * fc)) ** 2) / k)
    half = stats.norm.ppf(1 - alpha / 2) * se
    return {**_result(estimate, estimate - half, estimate + half, k, alpha, small_sample), "lam": lam}


def sampling_probabilities(uncertainty: np.ndarray, floor: float) -> np.ndarray:
    """Per-draw probabilities q_i = floor / N + (1 − floor) · u_i / Σu (uniform when Σu = 0)."""
    u = np.nan_to_num(np.asarray(uncertainty, float), nan=0.0).clip(min=0)
    n = len(u)
    if not 0 < floor <= 1:
        raise InputError(f"the sampling floor must be in (0, 1], got {floor!r}", setting="floor")
    share = u / u.sum() if u.sum() > 0 else np.full(n, 1.0 / n)
    return floor / n + (1 - floor) * share


def text_uncertainty(predictions: pd.DataFrame, question_id: str, judges: list[str] | None = None) -> pd.Series:
    """text id → sqrt of the mean over (trusted) judges of the predicted variance ``var`` of ``question_id``."""
    pred = predictions[predictions.question_id == question_id]
    if judges:
        pred = pred[pred.judge_id.isin([str(j) for j in judges])]
    if "var" not in pred.columns:
        raise InputError(
            "predictions need a 'var' column to rank texts by uncertainty", file=source_of(predictions), column="var"
        )
    bad = ~np.isfinite(pred["var"].to_numpy(float)) | (pred["var"].to_numpy(float) < 0)
    if bad.any():
        row = pred.index[bad.argmax()]
        raise InputError(
            f"variance {pred.at[row, 'var']!r} is not a non-negative number",
            file=source_of(predictions),
            row=int(row),
            column="var",
        )
    return np.sqrt(pred.groupby("text_id")["var"].mean())


def suggest(
    texts: pd.DataFrame,
    uncertainty: pd.Series,
    budget: int,
    floor: float,
    seed: int = 0,
    round_id: str = "1",
) -> pd.DataFrame:
    """Draw ``budget`` texts of each system, with replacement, by :func:`sampling_probabilities`.

    ``texts``: ``text_id, system_id`` of the texts to choose from (rows as in its file);
    ``uncertainty``: text id → u. One row per text (``SAMPLING_COLUMNS``): its per-draw probability
    ``prob`` within its system and round, the times it was drawn (``draws``: label the texts with
    draws > 0, in round ``round_id``) and u."""
    rows = []
    rng = np.random.default_rng(seed)
    for system, part in texts.groupby("system_id", sort=True):
        if budget > len(part):
            raise InputError(
                f"budget {budget} is larger than the {len(part)} texts of system {system!r}",
                file=source_of(texts),
                row=int(part.index[0]),
                column="system_id",
            )
        part = part.sort_values("text_id", kind="stable")
        u = uncertainty.reindex(part.text_id).to_numpy(float)
        q = sampling_probabilities(u, floor)
        draws = np.bincount(rng.choice(len(part), budget, replace=True, p=q), minlength=len(part))
        rows.append(
            pd.DataFrame(
                {
                    "text_id": part.text_id.to_numpy(),
                    "system_id": system,
                    "round": str(round_id),
                    "prob": q,
                    "draws": draws,
                    "uncertainty": u,
                }
            )
        )
    return pd.concat(rows, ignore_index=True)[SAMPLING_COLUMNS]


def read_sampling(path) -> pd.DataFrame:
    """A sampling-probability file of :func:`suggest` (``text_id, prob, draws`` + ``round``), checked:
    each ``prob`` a number in (0, 1], each ``draws`` a non-negative integer, no (text, round) twice."""
    from llmrubric.io.tables import read_raw

    path = Path(path)
    if not path.is_file():
        raise InputError("sampling-probability file not found", file=str(path))
    df = read_raw(path)
    for column in ("text_id", "prob", "draws"):
        if column not in df.columns:
            raise InputError(
                f"a sampling-probability file needs a {column!r} column (has {list(df.columns)})",
                file=str(path),
                column=column,
            )
    df = df.assign(text_id=df.text_id.astype(str).str.strip())
    df["round"] = df["round"].astype(str).str.strip() if "round" in df.columns else "1"
    prob = pd.to_numeric(df.prob, errors="coerce").to_numpy(float)
    bad = ~np.isfinite(prob) | (prob < 0) | (prob > 1)
    if bad.any():
        row = df.index[bad.argmax()]
        raise InputError(
            f"probability {df.at[row, 'prob']!r} is not a number in [0, 1]", file=str(path), row=int(row), column="prob"
        )
    draws = pd.to_numeric(df.draws, errors="coerce").to_numpy(float)
    bad = ~np.isfinite(draws) | (draws < 0) | (draws != np.round(draws))
    if bad.any():
        row = df.index[bad.argmax()]
        raise InputError(
            f"draws {df.at[row, 'draws']!r} is not a non-negative integer", file=str(path), row=int(row), column="draws"
        )
    check_unique(
        df,
        ["text_id", "round"],
        "text {text_id!r} is listed twice in round {round!r}",
        file=str(path),
        column="text_id",
    )
    df["prob"], df["draws"] = prob, draws.astype(int)
    df.attrs["source"] = str(path)
    return df
