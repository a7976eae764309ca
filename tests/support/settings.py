"""The shipped settings the tests train with: ``trainer=fast`` (``conf/trainer/fast.yaml``) and, except where
intervals are what a test checks, ``model.auto.intervals=main``; the paper's network, and the demo experiment shrunk
to one small network."""

from __future__ import annotations

from llmrubric.config import compose, group

from .paths import ROOT

FAST = group("trainer", "fast")  # the trainer settings as a dict, for the Python API
# model.auto settings for the tests that are not about intervals: the main question's calibration only, which
# spares the weighted members' refits on every other question in each inner fold (half the time of test_auto.py)
MAIN_INTERVALS = {"intervals": "main"}
FAST_OVERRIDES = ["trainer=fast", "model.auto.intervals=main"]  # the same for the Hydra apps and the CLI
PAPER = group("model", "paper")  # the paper's network; tests that need it say so (the default is the shipped model)
SIMULATED = ROOT / "data" / "simulated"
TABLES = ("annotations", "features", "texts")


def small_demo(*overrides: str):
    """The demo experiment, shrunk, with absolute data paths (runs from any working directory)."""
    data = [f"data.train.{t}='{SIMULATED / f'{t}.csv'}'" for t in TABLES]
    small = [
        *FAST_OVERRIDES,
        "++model.ensemble=1",
        "model.auto.candidates=[network]",  # model=auto with the network alone: its histories are logged
        "baselines=[]",
    ]
    return compose("config", ["experiment=demo", *small, *data, *overrides])
