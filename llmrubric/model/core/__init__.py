"""The parts every model family shares, below the families (they import none): the registry of
families (:mod:`llmrubric.model.core.registry`), the one checkpoint format
(:mod:`llmrubric.model.core.checkpoints`), feature encoding and the other helpers the families use."""
