"""The model settings (``model.*``, ``conf/model/``): the calibration network, ``model=auto``'s candidates,
and the named model files read without composing."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from llmrubric.config.paths import conf_path

LABEL_RULES = ("argmax", "rounded_mean", "frequency_thresholds", "kappa_thresholds")
NETWORK_INPUTS = ("probabilities", "expected", "both")  # the order the search space lists them in


@dataclass
class AutoConfig:
    """``model=auto`` (:mod:`llmrubric.model.auto`): candidate families compared by inner cross-validation.

    Attributes:
        candidates: the candidate names (``candidate: true`` in ``conf/presets.yaml``,
            ``registry.names(candidate=True)``; ``network`` is the network of the other ``model.*`` settings);
            null: the default candidates (``default_candidate`` there; ``llmrubric.model.auto_settings.default_candidates``),
            resolved by :class:`llmrubric.model.auto.AutoCalibrator` (the registry is a higher layer than config).
        rule: ``bb_stack`` (the default: the stack's weights averaged over Bayesian-bootstrap draws of the inner
            folds, :mod:`llmrubric.model.core.combine`), ``select`` (the candidate with the lowest inner-CV NLL),
            ``stack`` (non-negative weights summing to 1 that maximise the inner-CV likelihood of the main
            question), ``bb_select`` (each candidate's share of the Bayesian-bootstrap
            draws of the inner folds it wins: pseudo-BMA+ in its large-sample limit) or ``auto`` (select or stack, each rule's weights fitted on all
            inner folds but one and scored on that one; ``stack`` where its mean gain per fold exceeds one
            standard error).
        group: inner folds by ``text`` or ``system``; ``auto``: by system under the protocols that
            score unseen systems (``systems``, ``system_groups``), else by text.
        folds: inner folds (by system: at most one per training system); 3 takes 0.61–0.91 × the
            time of 5 but lost up to 0.006 pair NLL on the missing-blocks design set at eee7a00 (0.017 in an
            earlier run).
        system_level: the system level with partial pooling (:mod:`llmrubric.model.core.system_level`):
            ``auto`` compares every candidate with and without it by the inner CV where the training
            data have ``level_min_systems`` systems with labels (else records why not); ``on``: only with
            it (fewer than 3 systems are an error); ``off``: never.
        level_min_systems: the labelled training systems ``system_level=auto`` needs before it compares the
            level (3 at the least: its inner folds then fit levels on 2); fewer: candidates without it
            (``system_level=on`` needs 3). 5: the inner folds fit each level on 4 systems or more; on 4 training
            systems (DS1..DS5) levels fitted on 3 took stacking weight they lost on the outer test.
        level_summary: the summary ``x_s`` a system's level is regressed on: ``llm`` (the LLM
            sources' mean expected answer of the main question), ``model`` (the text model's mean
            prediction for the system: every rubric has it) or ``auto`` (``llm`` where every labelled
            training system has LLM answers of the main question, else ``model``).
        level_slope_sd: the level's slope prior ``N(0, level_slope_sd²)`` (summary and level share the scale).
        level_tau_scale: the between-system spread's prior ``τ ~ HalfNormal(level_tau_scale · range)``.
        level_beyond_sd: beyond the training systems' range of summaries the slope may change by
            ``N(0, level_beyond_sd²)``: extrapolated levels widen, their mean unchanged.
        tune_trials: with N > 0, each candidate whose settings declare a search space (the network, the
            mixed model) is first tuned by N Optuna trials (TPE seeded by the seed) on the same inner
            folds, and compared and refitted with its best trial's parameters; 0: their own settings.
            Each trial costs one inner CV of the candidate (the network's: N times its inner CV).
        bb_draws: Bayesian-bootstrap draws of ``rule=bb_stack`` and of the weights' stability record.
        cover: the candidate fitted (weight 0) for the answered questions that no weighted candidate predicts,
            such as a categorical question where only ordinal families have weight: it must predict every kind
            of question.
        intervals: the questions the inner folds calibrate conformal intervals for: ``all`` (every answered
            question, the others than the main one from the fold models the inner CV made: the weighted members
            whose fold models predict them, the network's heads; the members are refitted on each inner fold
            only for a question none of those predicts), ``refit`` (every answered question, every weighted
            member refitted on each inner fold where its fold models do not predict the question: the scores of
            the very mixture that predicts, at the cost of those refits) or ``main`` (the main question only).
        workers: processes that fit the candidates' inner folds (:mod:`llmrubric.model.core.parallel_folds`), each
            every candidate on its share of the folds (the network's one training program split into this many
            groups of its fold models and refit); capped by the CPUs, and 1 (this process alone, no pool) in a
            worker of another process pool or where the data are too small for a pool to pay. 1: always this
            process. The figures do not depend on it.
        fold_ensemble: at most this many networks in each inner-fold model of a candidate that averages an
            ensemble (the network; its first members, seeded as the refit's), the refit on all the training data
            keeping ``model.ensemble``; null: ``model.ensemble`` in the folds too. The inner CV only weighs and
            calibrates; 3 took a fifth off the fit seconds leaving one system out of DialSumm for 0.002 pair NLL
            (``benchmarks/README.md#training-and-scoring-cost``).
    """

    candidates: list[str] | None = None
    rule: str = "bb_stack"
    group: str = "auto"
    folds: int = 5
    system_level: str = "auto"
    level_min_systems: int = 5
    level_summary: str = "auto"
    level_slope_sd: float = 5.0
    level_tau_scale: float = 0.25
    level_beyond_sd: float = 2.0
    tune_trials: int = 0
    bb_draws: int = 100
    cover: str = "ridge_judge"
    intervals: str = "all"
    workers: int = 2
    fold_ensemble: int | None = 3


@dataclass
class LinearConfig:
    """The linear family ``ridge_judge`` (``model.linear.*``; ``ridge_context`` is it with ``contextual``).

    Attributes:
        contextual: also give each text its system's means of the inputs (features only, so known for a
            new system): the between-system slope is learned apart from the within-system one
            (Mundlak's device); texts without a system id get no contextual effect.
        context_scales: the grid of the contextual columns' scale s: their ridge penalty is the within
            penalty / s² (0: no contextual effect, the plain ridge), chosen by cross-validation over
            the training systems (squared error of held-out systems' answers).
        context_folds: folds of that cross-validation, by system (one per system up to this many).
    """

    contextual: bool = False
    context_scales: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.3, 1.0, 3.0, 10.0])
    context_folds: int = 10


@dataclass
class LabelRuleConfig:
    """The label rule of an ordered main question (:mod:`llmrubric.model.core.label_rule`), chosen by
    cross-validation on ``model=auto``'s out-of-fold predictions (the network alone: its in-sample ones).

    Attributes:
        rules: the candidate rules (``argmax``, ``rounded_mean``, ``frequency_thresholds``, ``kappa_thresholds``).
        objective: ``qwk`` (quadratic weighted κ) or ``kappa`` (Cohen's κ): the agreement the labels are for,
            what the rules are chosen by and ``kappa_thresholds`` maximises. ``qwk`` by default because the
            question is ordered (a label one grade off is nearer than three off) and a distance is a steadier
            criterion than exact matches on an inner fold's few pairs of the rare grades; users who report
            plain κ set ``kappa`` (docs/models.md#labels compares both on simulated sets).
    """

    rules: list[str] = field(default_factory=lambda: list(LABEL_RULES))
    objective: str = "qwk"


@dataclass
class ModelConfig:
    """The calibration network and its ensemble (``model.*``), defaults chosen by synthetic
    5-fold CV (``benchmarks/table1.py``, NLL of the main question on training texts only).

    Attributes:
        h1, h2: hidden layer sizes.
        inputs: ``expected`` (each feature block's expected answer), ``probabilities`` (the raw
            distributions, the paper's) or ``both``.
        personalize: ``input`` (a judge one-hot on the input), ``deltas`` (per-judge layer
            deltas, eq. 3-5 of the paper) or ``none``.
        input_dropout: dropout on the inputs while training (0.2 beat 0.0: NLL 1.0557 vs 1.0594).
        ensemble: networks whose average distribution is predicted.
        head: ``softmax`` (the network's heads), ``ordinal`` or ``combined``
            (:mod:`llmrubric.model.families.network.cumulative`); ``monotone`` applies to the latter two.
        family: ``network`` (this network alone) or ``auto`` (the model chosen by inner
            cross-validation among ``auto.candidates``, :class:`AutoConfig`).
        linear: the linear family's settings (:class:`LinearConfig`).
        label_rule: how predicted distributions become labels (:class:`LabelRuleConfig`).
        sample_prior: the Dirichlet strength (pseudo-answers spread evenly over the options) that smooths each
            block counted from sampled answers (the features' ``samples``) before the model reads it; 0, the
            default, reads the counts as they are (unbiased, and what the adaptive stop needs: docs/multi_source.md);
            blocks without ``samples`` are read as they are (:mod:`llmrubric.model.core.samples`).
    """

    h1: int = 25
    h2: int = 25
    inputs: str = "expected"
    personalize: str = "input"
    input_dropout: float = 0.2
    ensemble: int = 5
    head: str = "softmax"
    monotone: bool = False
    family: str = "network"
    auto: AutoConfig = field(default_factory=AutoConfig)
    linear: LinearConfig = field(default_factory=LinearConfig)
    label_rule: LabelRuleConfig = field(default_factory=LabelRuleConfig)
    sample_prior: float = 0.0

    @classmethod
    def search_space(cls, base: dict) -> dict:
        """The network's part of the search (``search=optuna``, :mod:`llmrubric.experiments.search`): the
        paper's hidden sizes, inputs, personalization and input dropout; with a cumulative ``head``
        (``ordinal``, ``combined``), which scores expected answers and personalizes by judge cut points,
        inputs without the raw distributions and no personalization."""
        cumulative = base.get("head", "softmax") != "softmax"
        return {
            "h1": {"type": "categorical", "choices": [10, 25, 50, 100]},
            "h2": {"type": "categorical", "choices": [10, 25, 50, 100]},
            "inputs": {"type": "categorical", "choices": ["expected", "both"] if cumulative else list(NETWORK_INPUTS)},
            "personalize": {"type": "categorical", "choices": ["none"] if cumulative else ["deltas", "input", "none"]},
            "input_dropout": {"type": "float", "low": 0.0, "high": 0.5},
        }


def model_settings(model: dict | ModelConfig | None = None) -> dict:
    """:class:`ModelConfig`'s defaults updated by ``model`` (unknown keys are kept, for the caller to reject)."""
    from omegaconf import Container, OmegaConf

    given = asdict(model) if isinstance(model, ModelConfig) else dict(model or {})
    plain = lambda v: OmegaConf.to_container(v, resolve=True) if isinstance(v, Container) else v
    given = {
        k: asdict(v) if isinstance(v, (AutoConfig, LinearConfig, LabelRuleConfig)) else plain(v)
        for k, v in given.items()
    }
    return {**asdict(ModelConfig()), **given}


def model_overrides(name: str) -> dict:
    """What ``conf/model/<name>.yaml`` sets over :class:`ModelConfig`'s defaults (``model_overrides("paper")``:
    the paper's network), read without composing (so also inside a running Hydra app; the file's
    only default is the schema)."""
    import yaml

    from llmrubric.io.errors import yaml_error

    path = conf_path("model", f"{name}.yaml")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:  # a user's file of conf/model/
        raise yaml_error(e, str(path)) from None
    return {k: v for k, v in data.items() if k != "defaults"}


def model_file(name: str) -> dict:
    """The settings of ``conf/model/<name>.yaml`` over :class:`ModelConfig`'s defaults."""
    return model_settings(model_overrides(name))
