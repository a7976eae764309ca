"""The files a leaderboard writes: ``leaderboard.{md,csv,json}``, ``comparisons.csv``, ``density.png``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from llmrubric.io.files import write_json, write_table, write_text
from llmrubric.scoring.leaderboard.board import LeaderboardResult
from llmrubric.scoring.leaderboard.plots import density_plot

LABEL_HEADS = {"classical": "classical", "ppi": "PPI", "ppi_pp": "PPI++", "active_ppi_pp": "active PPI++"}


def markdown(board: pd.DataFrame, title: str = "", settings: dict | None = None) -> str:
    """A markdown leaderboard table; with label intervals, a ``k`` column and a legend that says what
    each interval column is and how its labels were sampled (``settings["label_intervals"]``)."""
    from llmrubric.scoring.labels import METHODS

    methods = [m for m in METHODS if m in board.columns]
    extra = [c for c in ("shift_low", "human") if c in board.columns]
    head = ["rank", "system", "score", "95% interval", "texts"]
    head += ["shift interval"] if "shift_low" in extra else []
    head += (["k"] if methods else []) + [f"{LABEL_HEADS[m]} [interval]" for m in methods]
    head += ["human"] if "human" in extra else []
    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in board.to_dict("records"):
        cells = [
            f"{r['rank']:g}",
            str(r["system"]),
            f"{r['score']:.3f}",
            f"[{r['low']:.3f}, {r['high']:.3f}]",
            str(r["texts"]),
        ]
        if "shift_low" in extra:
            cells.append(f"[{r['shift_low']:.3f}, {r['shift_high']:.3f}]")
        if methods:
            cells.append(str(r["labelled"]))
        cells += [f"{r[m]:.3f} [{r[m + '_low']:.3f}, {r[m + '_high']:.3f}]" for m in methods]
        if "human" in extra:
            cells.append(f"{r['human']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    info = (settings or {}).get("label_intervals")
    if info:
        level = f"{100 * (1 - info['alpha']):g} %"
        lines += [
            "",
            f"k: human-labelled texts of the system (draws under active sampling); sampling: {info['sampling']}.",
        ]
        kind = {"student": "widened to Student's t with k - 1 degrees of freedom", "normal": "normal"}[
            info["small_sample"]
        ]
        lines += [f"- {LABEL_HEADS[m]}: {info['methods'][m]}; {level}, {kind}" for m in methods]
    return "\n".join(lines) + "\n"


def write(
    result: LeaderboardResult, out_dir: str | Path, plot: bool = True, extra: dict | None = None
) -> dict[str, Path]:
    """``leaderboard.{md,csv,json}``, ``comparisons.csv`` and ``density.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    title = f"{result.settings['question']}: mean judge-free score over {len(result.settings['judges'])} judges"
    paths = {
        "csv": write_table(result.board, out_dir / "leaderboard.csv"),
        "comparisons": write_table(result.comparisons, out_dir / "comparisons.csv"),
        "json": write_json(
            {
                "settings": result.settings,
                "leaderboard": result.board.to_dict("records"),
                "comparisons": result.comparisons.to_dict("records"),
                **(extra or {}),
            },
            out_dir / "leaderboard.json",
        ),
        "md": write_text(markdown(result.board, title, result.settings), out_dir / "leaderboard.md"),
    }
    if plot:
        paths["plot"] = density_plot(result.systems, result.boot, out_dir / "density.png", title)
    return paths
