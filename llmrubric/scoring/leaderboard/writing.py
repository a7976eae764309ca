"""The files a leaderboard writes: ``leaderboard.{md,csv,json}``, ``comparisons.csv``, ``density.png``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from llmrubric.io.files import write_json, write_table, write_text
from llmrubric.scoring.leaderboard.board import LeaderboardResult
from llmrubric.scoring.leaderboard.plots import density_plot

log = logging.getLogger(__name__)
LABEL_HEADS = {"classical": "classical", "ppi": "PPI", "ppi_pp": "PPI++", "active_ppi_pp": "active PPI++"}


def markdown(board: pd.DataFrame, title: str = "", settings: dict | None = None) -> str:
    """A markdown leaderboard table; with rank intervals, the ranks each system can hold (``2–4``) and a legend
    (``settings["rank_intervals"]``: also of the shift and label ranks); with label intervals, a ``k`` column and a legend that says what each
    interval column is and how its labels were sampled (``settings["label_intervals"]``)."""
    from llmrubric.scoring.labels import METHODS

    methods = [m for m in METHODS if m in board.columns]
    extra = [
        c for c in ("rank_low", "shift_low", "shift_rank_low", "level", "label_rank_low", "human") if c in board.columns
    ]
    head = ["rank", "system", "score", "95% interval"] + (["ranks"] if "rank_low" in extra else []) + ["texts"]
    head += ["shift interval"] if "shift_low" in extra else []
    head += ["shift ranks"] if "shift_rank_low" in extra else []
    head += ["level [interval]"] if "level" in extra else []
    head += ["transport"] if "transport" in board.columns else []
    head += (["k"] if methods else []) + [f"{LABEL_HEADS[m]} [interval]" for m in methods]
    head += ["label ranks"] if "label_rank_low" in extra else []
    head += ["human"] if "human" in extra else []
    lines = ([f"### {title}", ""] if title else []) + ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in board.to_dict("records"):
        cells = [
            f"{r['rank']:g}",
            str(r["system"]) + (" †" if r.get("beyond") is True else ""),
            f"{r['score']:.3f}",
            f"[{r['low']:.3f}, {r['high']:.3f}]",
            *([rank_range(r["rank_low"], r["rank_high"])] if "rank_low" in extra else []),
            str(r["texts"]),
        ]
        if "shift_low" in extra:
            cells.append(f"[{r['shift_low']:.3f}, {r['shift_high']:.3f}]")
        if "shift_rank_low" in extra:
            cells.append(rank_range(r["shift_rank_low"], r["shift_rank_high"]))
        if "level" in extra:
            cells.append(f"{r['level']:.3f} [{r['level_low']:.3f}, {r['level_high']:.3f}]")
        if "transport" in board.columns:
            cells.append(transport_cell(r))
        if methods:
            cells.append(str(r["labelled"]))
        cells += [f"{r[m]:.3f} [{r[m + '_low']:.3f}, {r[m + '_high']:.3f}]" for m in methods]
        if "label_rank_low" in extra:
            cells.append(rank_range(r["label_rank_low"], r["label_rank_high"]))
        if "human" in extra:
            cells.append(f"{r['human']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    ranks = (settings or {}).get("rank_intervals")
    if ranks and "rank_low" in extra:
        level = f"{100 * (1 - ranks['alpha']):g} %"
        lines += [
            "",
            f"ranks: the ranks each system can hold, all {ranks['systems']} jointly at {level} ({ranks['rank']}).",
        ]
        if "shift_rank" in ranks and "shift_rank_low" in extra:
            lines.append(
                f"shift ranks: the same for the human means, from the shift intervals ({ranks['shift_rank']})."
            )
        if "label_rank" in ranks and "label_rank_low" in extra:
            lines.append(
                f"label ranks: the same for the human means, from the k labelled texts ({ranks['label_rank']})."
            )
    if "beyond" in board.columns and board.beyond.eq(True).any():
        lines += [
            "",
            "†: the LLMs' answers put this new system beyond the training systems' range: its level and intervals "
            "extrapolate (the LLMs may misjudge it as a whole); label a few of its texts (--annotations).",
        ]
    check = (settings or {}).get("transport_check")
    if check:
        lines += ["", f"transport: {check['rule']}; the level interval of each system: its level_interval column."]
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
        ranks = (
            {r["system"]: "ranks " + rank_range(r["rank_low"], r["rank_high"]) for r in result.board.to_dict("records")}
            if "rank_low" in result.board.columns
            else None
        )
        if "transport" in result.board.columns:  # the plot's legend says which systems were checked, and the verdict
            verdicts = result.board.set_index("system").transport.dropna()
            ranks = {
                s: "; ".join(
                    x for x in ((ranks or {}).get(s), f"transport {verdicts[s]}" if s in verdicts else None) if x
                )
                for s in result.board.system
            }
        bands = max((len(r) for r in result.boot["text_scores"].values()), default=0)
        log.info(
            "drawing density.png: %d systems, bands over %d bootstrap replicates (--no-plot skips it)",
            len(result.systems),
            bands,
        )
        paths["plot"] = density_plot(result.systems, result.boot, out_dir / "density.png", title, ranks=ranks)
    return paths


def transport_cell(r: dict) -> str:
    """A system's transport verdict with its mean residual's interval and margin (``-`` for a system not checked)."""
    verdict = r.get("transport")
    if not isinstance(verdict, str):
        return "-"
    if not np.isfinite(r.get("transport_low", np.nan)):
        return verdict
    fallback = " → PPI++" if verdict in ("FAIL", "INCONCLUSIVE") else ""
    return (
        f"{verdict}{fallback}: residual {r['transport_residual']:+.3f} "
        f"[{r['transport_low']:+.3f}, {r['transport_high']:+.3f}] vs ±{r['transport_margin']:.3f}"
    )


def rank_range(low, high) -> str:
    """A rank interval as text: ``2–4``, or ``3`` when it is one rank."""
    low, high = int(low), int(high)
    return str(low) if low == high else f"{low}–{high}"
