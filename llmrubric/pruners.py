"""Successive halving on intermediate values, so that trials trained together compete.

Optuna's ``SuccessiveHalvingPruner`` (ASHA) records a trial's rung value when that trial is
judged, so within a batch of trials reporting at the same epoch the first ones judged see
no competitors and are always promoted. Here a trial at a rung step (``min_resource ·
η^k``) is compared with every trial that has reported a value at that step: earlier trials,
finished or pruned, and batch mates that have reported (the search reports a whole batch
before judging any of it). It continues if its value is among the best ``max(1, n // η)``
of those ``n`` values (lower is better).
"""

from __future__ import annotations

import math

import optuna

COMPETING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)


class SuccessiveHalving(optuna.pruners.BasePruner):
    """Prune at steps ``min_resource · reduction_factor^k`` unless among the best 1/η there (minimisation)."""

    def __init__(self, min_resource: int, reduction_factor: int = 3):
        if min_resource < 1 or reduction_factor < 2:
            raise ValueError(f"successive halving needs min_resource >= 1 and reduction_factor >= 2, got {min_resource}, {reduction_factor}")
        self.min_resource, self.reduction_factor = int(min_resource), int(reduction_factor)

    def is_rung(self, step: int) -> bool:
        ratio = step / self.min_resource
        if ratio < 1 or ratio != int(ratio):
            return False
        k = round(math.log(ratio, self.reduction_factor))
        return self.min_resource * self.reduction_factor**k == step

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or not self.is_rung(step):
            return False
        value = trial.intermediate_values[step]
        if not math.isfinite(value):
            return True
        values = sorted(
            v for t in study.get_trials(deepcopy=False, states=COMPETING)
            if math.isfinite(v := t.intermediate_values.get(step, math.nan))
        )
        keep = max(1, len(values) // self.reduction_factor)
        return value > values[keep - 1]
