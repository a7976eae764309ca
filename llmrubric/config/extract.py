"""Feature extraction settings (``conf/extract/``: ``llmrubric extract``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from llmrubric.io.errors import InputError
from llmrubric.io.guards import check_range


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


COSTS = ("calls", "tokens")  # what AdaptiveConfig.cost may be


def adaptive_settings(settings: dict | AdaptiveConfig | None = None, prefix: str = "adaptive") -> dict:
    """:class:`AdaptiveConfig`'s defaults under ``settings``, checked; a bad value names ``<prefix>.<key>``."""
    given = asdict(settings) if isinstance(settings, AdaptiveConfig) else dict(settings or {})
    unknown = sorted(set(given) - set(asdict(AdaptiveConfig())))
    if unknown:
        raise InputError(f"unknown adaptive setting(s) {unknown}", setting=f"{prefix}.{unknown[0]}")
    s = {**asdict(AdaptiveConfig()), **given}
    if s["budget"] is not None:
        s["budget"] = check_range(f"{prefix}.budget", s["budget"], 1, integer=True)
    s["min_gain"] = check_range(f"{prefix}.min_gain", s["min_gain"], 0)
    s["draws"] = check_range(f"{prefix}.draws", s["draws"], 4, integer=True)
    if s["cost"] not in COSTS:
        raise InputError(f"{s['cost']!r} is not one of {list(COSTS)}", setting=f"{prefix}.cost")
    return s


@dataclass
class PriceConfig:
    """What a dry run prices tokens at (``--dry-run``): per million prompt and output tokens, in the user's
    currency, each >= 0, both given (0 for free tokens) or neither (None: no cost is printed)."""

    prompt: float | None = None
    output: float | None = None


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
        mode: how a block's distribution is read: ``logprob`` (the answer token's probabilities), or, from a
            server's generated text, ``sampled``, ``verbalized``, ``reasoned`` (docs/extract.md; their settings are
            the openai backend's keys).
        price: per-token prices for ``--dry-run``'s cost (:class:`PriceConfig`).
        tokenizer: a local model (HF folder or .gguf) whose tokenizer counts a dry run's prompt tokens; None: the
            model's own for the transformers backend, an estimate (4 characters a token) for a server.
        context_tokens: the judge's context window in tokens (a server's ``n_ctx``): a dry run counts the prompts
            that with their output budget exceed it (``prompts_over_context``); None: not checked.
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
    mode: str = "logprob"
    price: PriceConfig = field(default_factory=PriceConfig)
    tokenizer: str | None = None
    context_tokens: int | None = None
