"""Feature extraction settings (``conf/extract/``: ``llmrubric extract``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExtractConfig:
    """The settings every extract config shares (``conf/extract/``, ``--config``); the backends' own
    keys (:data:`llmrubric.extract.backends.BACKEND_KEYS`) come from the config file or flags.

    Attributes:
        family: ``likert``, ``self_rating``, ``nugget_support`` or ``answer_quality``.
        template: None: the family's template under ``conf/prompts/``.
        rubric: the likert family's rubric YAML.
        model: an HF model folder, a .gguf file, or the server's model name.
        orders: likert: >1 asks each question with the options in rotated orders, averaged.
        min_label_mass: blocks whose labels get less total probability are marked ``low_label_mass``.
        detect_injection: True: blocks whose text matches a pattern are marked ``possible_injection``.
        injection_patterns: None: ``conf/injection/default.yaml``.
    """

    backend: str = "transformers"
    family: str = "likert"
    template: str | None = None
    rubric: str | None = None
    model: str | None = None
    orders: int = 1
    min_label_mass: float = 0.05
    detect_injection: bool = False
    injection_patterns: str | None = None
