"""llmrubric."""
