"""The built-in model families: importing this module registers each of them in
:mod:`llmrubric.model.registry` (``import llmrubric.model`` does). A new family is one module that
registers itself, listed here."""

from llmrubric.model import auto, baselines, calibrator, mixed, oracles

BUILT_IN = (calibrator, baselines, mixed, oracles, auto)
