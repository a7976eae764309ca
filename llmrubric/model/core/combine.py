"""How ``model=auto`` combines its candidates from their out-of-fold likelihoods (pairs, candidates) of the
observed answers, grouped in inner folds.

- ``select``: all weight on the candidate with the lowest out-of-fold NLL.
- ``stack``: non-negative weights summing to 1 that maximise the out-of-fold log-likelihood of the weighted
  mixture (a super learner; SLSQP on the simplex).
- ``bb_stack``: stacking averaged over Bayesian-bootstrap draws of the inner folds (each draw weighs the folds
  by Dirichlet(1, …, 1); Yao, Vehtari, Simpson and Gelman, Bayesian Analysis 2018, use the same device for
  pseudo-BMA+). Where the folds agree the draws agree and the weights are the stack's; where each fold has another
  winner (few systems, a weak signal) the draws disagree and the average spreads the weight over the candidates
  that won somewhere instead of betting on the pooled optimum of 4-5 groups. The draws' spread is the record of how
  stable the weights are.
- ``bb_select``: each candidate's share of the Bayesian-bootstrap draws of the inner folds in which it has the
  lowest NLL: pseudo-BMA+ (Yao et al. 2018; ``loo::loo_model_weights(method = "pseudobma")``) in its large-sample
  limit, where the exponentiated sums of log-likelihood differences over hundreds of pairs are an argmax. Where
  the folds agree it is ``select``; where each fold has another winner it spreads the weight over those winners
  only (never over a candidate no draw prefers, as a stack does for complementarity).
- ``auto``: :func:`rule_scores`.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

RULES = ("auto", "select", "stack", "bb_stack", "bb_select")
PROB_FLOOR = 1e-12


def mixture_weights(likelihood: np.ndarray, pair_weights: np.ndarray | None = None, start=None) -> np.ndarray:
    """Stacking weights maximising the (``pair_weights``-weighted) mean log-likelihood of the mixture: a concave
    problem on the simplex, solved by SciPy's SLSQP with its exact gradient (40 times faster than EM, whose
    slow steps near the simplex's faces stopped it short of the optimum)."""
    m = likelihood.shape[1]
    pw = np.full(len(likelihood), 1.0 / len(likelihood)) if pair_weights is None else pair_weights / pair_weights.sum()
    start = np.full(m, 1.0 / m) if start is None else np.asarray(start, dtype=float)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        mixed = np.maximum(likelihood @ w, PROB_FLOOR)
        return float(-(pw @ np.log(mixed))), -((pw / mixed) @ likelihood)

    result = minimize(
        loss,
        start,
        jac=True,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * m,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(m)}],
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    if not result.success:
        raise RuntimeError(f"stacking weights: SLSQP did not converge ({result.message})")
    fitted = np.clip(result.x, 0.0, None)
    return fitted / fitted.sum()


def weights(likelihood: np.ndarray, rule: str, fold_of: np.ndarray | None = None, draws: int = 100, seed: int = 0):
    """Candidate weights of ``rule`` (not ``auto``) from out-of-fold likelihoods (pairs, candidates)."""
    if rule == "select":
        out = np.zeros(likelihood.shape[1])
        out[np.argmin(-np.log(likelihood).mean(axis=0))] = 1.0
        return out
    if rule == "stack":
        return mixture_weights(likelihood)
    if rule == "bb_select":
        return bootstrap_wins(likelihood, fold_of, draws, seed).mean(axis=0)
    return bootstrap_weights(likelihood, fold_of, draws, seed).mean(axis=0)


def bootstrap_weights(likelihood: np.ndarray, fold_of: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """(draws, candidates): the stack's weights under ``draws`` Dirichlet(1) weightings of the folds (each fold's
    weight spread evenly over its pairs)."""
    index, draws_ = fold_draws(fold_of, draws, seed)
    sizes = np.bincount(index)
    pooled = mixture_weights(likelihood)
    return np.array([mixture_weights(likelihood, (g / sizes)[index], start=pooled) for g in draws_])


def fold_draws(fold_of: np.ndarray, draws: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(each pair's fold index, (draws, folds) Dirichlet(1, …, 1) weightings of the folds)."""
    folds, index = np.unique(fold_of, return_inverse=True)
    return index, np.random.default_rng(seed).dirichlet(np.ones(len(folds)), size=draws)


def bootstrap_wins(likelihood: np.ndarray, fold_of: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """(draws, candidates): one-hot, the candidate with the lowest NLL under each of the Bayesian-bootstrap
    weightings of the folds that :func:`bootstrap_weights` draws (each fold's weight on its mean NLL)."""
    index, g = fold_draws(fold_of, draws, seed)
    loss = -np.log(likelihood)
    fold_loss = np.stack([loss[index == f].mean(axis=0) for f in range(g.shape[1])])  # (folds, candidates)
    return np.eye(likelihood.shape[1])[np.argmin(g @ fold_loss, axis=1)]


def combine(
    likelihood: np.ndarray, rule: str, fold_of: np.ndarray, names: list[str], draws: int, seed: int
) -> tuple[np.ndarray, dict | None]:
    """The weights of ``rule`` (not ``auto``) and, with 2+ inner folds and 2+ candidates, the :func:`stability`
    record; the Bayesian bootstrap runs once for both."""
    several = len(np.unique(fold_of)) > 1 and likelihood.shape[1] > 1
    boot = bootstrap_weights(likelihood, fold_of, draws, seed) if several or rule == "bb_stack" else None
    fitted = boot.mean(axis=0) if rule == "bb_stack" else weights(likelihood, rule, fold_of, draws, seed)
    return fitted, stability(likelihood, fold_of, names, boot) if several else None


def stability(likelihood: np.ndarray, fold_of: np.ndarray, names: list[str], boot: np.ndarray) -> dict:
    """How stable the weights are across the inner folds: each fold's own stacking weights and the Bayesian
    bootstrap draws' (``boot``: :func:`bootstrap_weights`) mean and standard deviation, per candidate."""
    by_fold = {int(k): mixture_weights(likelihood[fold_of == k]) for k in np.unique(fold_of)}
    return {
        "by_fold": {k: {n: round(float(x), 4) for n, x in zip(names, w)} for k, w in by_fold.items()},
        "bootstrap_mean": {n: round(float(x), 4) for n, x in zip(names, boot.mean(axis=0))},
        "bootstrap_sd": {n: round(float(x), 4) for n, x in zip(names, boot.std(axis=0))},
        "draws": len(boot),
    }


def rule_scores(likelihood: np.ndarray, fold_of: np.ndarray) -> dict:
    """Each rule's cross-validated NLL on the inner folds' out-of-fold likelihoods (pairs, candidates):
    its weights fitted on every fold but one and scored on that one (no candidate is refitted), each
    fold's NLL, and the rule ``auto`` takes: ``stack`` only where its mean gain per fold exceeds one
    standard error of the folds' gains (the one-standard-error rule: the simpler ``select`` unless the
    folds agree that stacking is better)."""
    folds = np.unique(fold_of)
    per_fold = {rule: [] for rule in ("select", "stack")}
    for rule, values in per_fold.items():
        for k in folds:
            w = weights(likelihood[fold_of != k], rule)
            values.append(float(-np.log(np.maximum(likelihood[fold_of == k] @ w, PROB_FLOOR)).mean()))
    sizes = np.array([(fold_of == k).sum() for k in folds])
    out = {rule: float(np.average(values, weights=sizes)) for rule, values in per_fold.items()}
    gains = np.subtract(per_fold["select"], per_fold["stack"])
    se = float(gains.std(ddof=1) / np.sqrt(len(gains))) if len(gains) > 1 else float("inf")
    out |= {"fold_nll": per_fold, "gain": float(gains.mean()), "gain_se": se}
    out["chosen"] = "stack" if gains.mean() > se else "select"
    return out
