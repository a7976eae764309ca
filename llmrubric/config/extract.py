"""Feature extraction settings (``conf/extract/``: ``llmrubric extract``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AdaptiveConfig:
    """The adaptive rubric (``extract features --adaptive``, ``rubric plan``; docs/adaptive.md): per text,
    ask next the block whose answer is expected to reduce the variance of the main question's
    predicted score most per unit cost; stop at ``budget`` calls or when that reduction falls below
    ``min_gain``.

    Attributes:
        budget: most LLM calls (blocks asked) per text; None: every block of the calibrator.
        min_gain: stop when the best expected variance reduction per unit cost is below this
            (squared score units; 0: stop only at the budget or when no block is left; 0.001, the
            largest threshold within 0.005 pair NLL of the best budget on the synthetic and simulated
            sets at ad57d93; docs/adaptive.md).
        cost: ``calls`` (each block costs 1) or ``tokens`` (a block costs its prompt's length in
            characters over the mean prompt length of the text's blocks).
        draws: the answer model's guesses of a block's answer that each expected reduction averages over.
        judges: whose mean predicted score is the target; None: the average over every judge of the
            calibrator (as ``score texts`` with no trusted judges).
        seed: seeds the answer model's guesses.
    """

    budget: int | None = None
    min_gain: float = 0.001
    cost: str = "calls"
    draws: int = 32
    judges: list[str] | None = None
    seed: int = 0


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
        adaptive: the adaptive rubric's settings (:class:`AdaptiveConfig`; used with ``--adaptive``).
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
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
