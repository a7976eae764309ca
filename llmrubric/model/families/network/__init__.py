"""The network family (LLM-Rubric, eq. 3–5): the calibrator (:mod:`.calibrator`, registered as
``network`` and its variants), its network (:mod:`.net`) and cumulative heads (:mod:`.cumulative`), the stacked
training engine (:mod:`.engine`), per-question temperatures (:mod:`.temperature`), the ordinal mix
(:mod:`.ordinal`) and the oracles' inputs and isotonic correction (:mod:`.oracles`). Importing it imports the
modules that register names."""

from llmrubric.model.families.network import calibrator, oracles  # noqa: F401  (they register the network's names)
