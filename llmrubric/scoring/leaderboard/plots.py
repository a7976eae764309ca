"""The density plot of judge-free text scores per system, with bands over bootstrap replicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy import stats

from llmrubric.scoring.leaderboard.systems import SystemData


def density_plot(
    systems: list[SystemData],
    boot: dict,
    path: str | Path,
    title: str = "",
    grid_points: int = 200,
    ranks: dict[str, str] | None = None,
) -> Path:
    """Per-system density (Gaussian KDE) of judge-free text scores with a 95 % band over replicates.

    The band is pointwise over the kept bootstrap replicates (resampled texts and judges,
    answers drawn from the predicted distributions), as the LLM-Rubric dashboard suggests.
    ``ranks`` (system → text, e.g. its rank interval and transport verdict) goes into each system's legend entry.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from llmrubric.io.files import atomic_path

    values = systems[0].values
    grid = np.linspace(np.nanmin(values) - 0.5, np.nanmax(values) + 0.5, grid_points)
    fig, ax = plt.subplots(figsize=(7, 4))
    for s in systems:
        scores = s.text_scores()
        curve = _kde(scores[~np.isnan(scores)], grid)
        held = f", {ranks[s.system]}" if (ranks or {}).get(s.system) else ""
        label = f"{s.system} (n={len(s.text_ids)}{held})"
        line = (
            ax.axvline(float(np.nanmean(scores)), label=label)
            if curve is None
            else ax.plot(grid, curve, label=label)[0]
        )
        reps = [c for c in (_kde(r, grid) for r in boot["text_scores"].get(s.system, [])) if c is not None]
        if reps:
            low, high = np.quantile(np.stack(reps), [0.025, 0.975], axis=0)
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_xlabel("judge-free score (mean over trusted judges)")
    ax.set_ylabel("density over texts")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
    return path


def _kde(x: np.ndarray, grid: np.ndarray) -> np.ndarray | None:
    """Gaussian KDE on ``grid``; None when it is undefined (fewer than 2 distinct values)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return None
    return stats.gaussian_kde(x)(grid)
