"""The density plot of judge-free text scores per system, with bands over bootstrap replicates."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmrubric.scoring.leaderboard.systems import SystemData

KDE_CELLS = 4_000_000  # float64 cells (samples × values × grid points, about 32 MB) of one block of kde_curves


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
        curve = kde_curves([scores[~np.isnan(scores)]], grid)[0]
        held = f", {ranks[s.system]}" if (ranks or {}).get(s.system) else ""
        label = f"{s.system} (n={len(s.text_ids)}{held})"
        line = (
            ax.axvline(float(np.nanmean(scores)), label=label)
            if curve is None
            else ax.plot(grid, curve, label=label)[0]
        )
        reps = [c for c in kde_curves(boot["text_scores"].get(s.system, []), grid) if c is not None]
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


def kde_curves(samples: list[np.ndarray], grid: np.ndarray) -> list[np.ndarray | None]:
    """The Gaussian KDE of each sample on ``grid``, as :class:`scipy.stats.gaussian_kde` gives it (Scott's
    bandwidth: the sample's sd × n^(-1/5)), for many samples at once: each distinct value's kernel weighted by its
    count (the bootstrap's text scores are means of drawn answers: a few distinct values), in blocks of at most
    :data:`KDE_CELLS` cells; None for a sample where it is undefined (fewer than 2 distinct values)."""
    curves: list[np.ndarray | None] = [None] * len(samples)
    distinct = [np.unique(x, return_counts=True) for x in samples]
    defined = [i for i, (values, _) in enumerate(distinct) if len(values) >= 2]
    width = max((len(distinct[i][0]) for i in defined), default=1)
    block = max(1, KDE_CELLS // (width * len(grid)))
    for lo in range(0, len(defined), block):
        rows = defined[lo : lo + block]
        values = np.full((len(rows), width), np.inf)  # padding: an infinitely far value adds exp(-inf) = 0
        counts = np.zeros((len(rows), width))
        for r, i in enumerate(rows):
            values[r, : len(distinct[i][0])], counts[r, : len(distinct[i][0])] = distinct[i]
        n = np.array([len(samples[i]) for i in rows])
        bandwidth = np.array([np.std(samples[i], ddof=1) for i in rows]) * n ** (-1 / 5)
        z = (grid[None, None, :] - values[:, :, None]) / bandwidth[:, None, None]
        kernels = np.exp(-0.5 * np.square(z, out=z), out=z)
        density = np.einsum("rv,rvg->rg", counts, kernels) / (n * bandwidth * np.sqrt(2 * np.pi))[:, None]
        for r, i in enumerate(rows):
            curves[i] = density[r]
    return curves
