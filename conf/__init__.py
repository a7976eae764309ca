"""The shipped settings (Hydra configs, prompts, rubrics, model manifests), installed as ``llmrubric.conf``."""
