"""The network family (LLM-Rubric, eq. 3–5): the calibrator (:mod:`.calibrator`, registered as
``network`` and its variants), its network (:mod:`.net`) and cumulative heads (:mod:`.cumulative`), the stacked
training engine (:mod:`.engine`), per-question temperatures (:mod:`.temperature`) and the ordinal mix
(:mod:`.ordinal`). Importing it imports the module that registers names."""

from llmrubric.model.families.network import calibrator  # noqa: F401  (it registers the network's names)
