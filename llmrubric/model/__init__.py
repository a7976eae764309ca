"""The calibrator and the models it is compared with; every family registered in
:mod:`llmrubric.model.registry` (:mod:`llmrubric.model.families` lists the built-in ones)."""

from llmrubric.model import families  # noqa: F401  (registers the built-in families)
