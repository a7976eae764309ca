"""Figures of the report: reliability diagrams (Figure 5), judge distributions (Figure 2), learning curves (Figure 4).

Figures are built with matplotlib's object API (no pyplot state, no display needed) and
written as PNG. Reliability diagrams draw the curve, band and example ticks that
relplot's ``prepare_rel_diagram`` computes (relplot's own plotting draws the band as one
polygon per mesh cell, which is two orders of magnitude slower).
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.figure import Figure

DPI = 110


def png_bytes(fig: Figure) -> bytes:
    """``fig`` rendered as PNG."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def reliability_panel(ax, diagram: dict, label: str) -> None:
    """Draw one relplot reliability diagram (Figure 5 style) on ``ax``.

    The red curve is E[y | f], thicker and more opaque where forecasts are dense (as in
    relplot), the gray band its bootstrap 95 % band (fading with the density), ticks above/below the axis a sample of examples whose
    answer is/is not ``label``; the text gives smECE ± the half-width of its interval.
    """
    t, mu = diagram["mesh"], diagram["mu"]
    density = np.asarray(diagram["density"], float)
    scaled = density / max(float(density.max()), 1e-12)
    cell = (scaled[:-1] + scaled[1:]) / 2
    ax.plot([0, 1], [0, 1], "k--", lw=0.8, alpha=0.3)
    if "lower" in diagram:
        lo, hi = diagram["lower"], diagram["upper"]
        quads = np.stack(
            [
                np.stack([t[:-1], lo[:-1]], 1),
                np.stack([t[1:], lo[1:]], 1),
                np.stack([t[1:], hi[1:]], 1),
                np.stack([t[:-1], hi[:-1]], 1),
            ],
            axis=1,
        )
        gray = np.tile([0.5, 0.5, 0.5, 0.0], (len(cell), 1))
        gray[:, 3] = 0.6 * cell
        ax.add_collection(PolyCollection(quads, facecolors=gray, edgecolors="none"))
    points = np.stack([t, mu], axis=1)
    segments = np.stack([points[:-1], points[1:]], axis=1)
    red = np.tile([0.85, 0.0, 0.0, 0.0], (len(cell), 1))
    red[:, 3] = np.clip(0.3 * (density[:-1] + density[1:]) / 2, 0.0, 1.0)
    ax.add_collection(LineCollection(segments, colors=red, linewidths=0.8 + 4.0 * cell, capstyle="round"))
    f, y = diagram["f_samp"], diagram["y_samp"]
    ax.vlines(f[y == 1], 0.0, 0.02, color="black", lw=0.6, clip_on=False)
    ax.vlines(f[y == 0], -0.02, 0.0, color="black", lw=0.6, clip_on=False)
    ce = diagram.get("ce")
    if ce is not None:
        width = diagram.get("ce_ci_width")
        ax.text(
            0.04,
            0.92,
            f"smECE {ce:.3f}" + (f" ± {width:.3f}" if width is not None else ""),
            fontsize=9,
            transform=ax.transAxes,
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    ax.grid(alpha=0.25)


def reliability_figure(panels: list[tuple[str, dict]], title: str) -> Figure:
    """One reliability diagram per answer value, side by side (like the paper's Figure 5).

    panels: (answer label, diagram from :func:`llmrubric.evaluation.calibration.reliability_diagram`).
    """
    fig = Figure(figsize=(3.2 * len(panels), 3.5))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (label, diagram) in zip(axes, panels):
        reliability_panel(ax, diagram, label)
        ax.set_title(f"answer {label}", fontsize=10)
        ax.set_xlabel(f"predicted p({label})", fontsize=9)
        ax.set_ylabel(f"observed frequency of {label}", fontsize=9)
        ax.tick_params(labelsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def judge_distribution_figure(
    observed: dict[str, np.ndarray],
    predicted: dict[str, np.ndarray],
    counts: dict[str, int],
    llm: np.ndarray | None,
    labels: list[str],
    title: str,
) -> Figure:
    """Each judge's observed answer distribution (black) next to the model's average prediction (gray), like Figure 2.

    A last panel shows the raw LLM's distribution over the same pairs (light gray), unless ``llm`` is None.
    """
    judges = list(observed)
    panels = max(1, len(judges) + (llm is not None))
    cols = min(6, panels)
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(2.2 * cols, 1.9 * rows))
    axes = fig.subplots(rows, cols, squeeze=False, sharey=True).ravel()
    x = np.arange(len(labels))
    for ax, judge in zip(axes, judges):
        ax.plot(x, observed[judge], "-o", color="black", lw=1.6, ms=3, label="judge")
        ax.plot(x, predicted[judge], "-o", color="0.55", lw=1.6, ms=3, label="LLM-Rubric")
        ax.set_title(f"judge {judge} (n={counts[judge]})", fontsize=8)
    if llm is not None:
        axes[len(judges)].plot(x, llm, "-o", color="0.8", lw=1.6, ms=3, label="LLM")
        axes[len(judges)].set_title("raw LLM", fontsize=8)
    for ax in axes[:panels]:
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in axes[panels:]:
        ax.set_visible(False)
    handles = (list(axes[0].lines[:2]) if judges else []) + (list(axes[len(judges)].lines) if llm is not None else [])
    fig.legend(handles, [h.get_label() for h in handles], loc="lower right", fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def learning_curve_figure(summary: pd.DataFrame, metrics: list[str], title: str) -> Figure:
    """Mean ± 1 sd of each metric against the share of training data (Figure 4).

    summary: rows per fraction with ``fraction``, ``<metric>_mean`` and ``<metric>_sd``.
    """
    fig = Figure(figsize=(3.4 * len(metrics), 3.0))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    x = 100 * summary.fraction.to_numpy(float)
    for ax, metric in zip(axes, metrics):
        mean = summary[f"{metric}_mean"].to_numpy(float)
        sd = np.nan_to_num(summary[f"{metric}_sd"].to_numpy(float))
        ax.fill_between(x, mean - sd, mean + sd, color="tab:blue", alpha=0.2, lw=0)
        ax.plot(x, mean, "-o", color="tab:blue", ms=3)
        ax.set_xlabel("% of training data", fontsize=9)
        ax.set_title(metric, fontsize=10)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig
