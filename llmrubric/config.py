"""Settings: typed defaults, the shipped ``conf/`` over them, and one loader for every entry point.

Each default is defined once, in a dataclass: :class:`ModelConfig` (the calibration network),
:class:`TrainConfig` (optimisation), :class:`SearchConfig`, :class:`ReportConfig`,
:class:`LoggerConfig`, and the CLI's :class:`ScoringConfig`, :class:`LabelsConfig`,
:class:`IRConfig` and :class:`ExtractConfig` (:data:`GROUP_SCHEMAS`). Each is registered in Hydra's
ConfigStore as ``schemas/<group>``; the YAML files of ``conf/<group>/`` start from it
(``defaults: [/schemas/<group>@_here_, _self_]``) and override only what differs by purpose
(``conf/model/paper.yaml``: the paper's architecture). ``conf/`` ships inside the package as
``llmrubric.conf`` (:func:`conf_path`), so an installed wheel has its settings, prompts, rubrics
and model manifests.

:func:`compose` is the loader: the Hydra apps (``llmrubric train|evaluate``, ``train.py``,
``evaluate.py``), the CLI's ``--config`` files (:func:`load_file`, :func:`command_settings`) and
the Python API (:func:`group`) all read settings through it, and a bad override or file is an
:class:`InputError` naming the setting.
"""

from __future__ import annotations

import importlib.resources
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from llmrubric.io.errors import InputError, report
from llmrubric.io.guards import check_range

CONF_PACKAGE = "llmrubric.conf"
CONF_PATH = f"pkg://{CONF_PACKAGE}"
VERSION_BASE = "1.3"


ACCELERATORS = ("auto", "cpu", "cuda", "gpu", "mps")


@dataclass
class TrainConfig:
    """Optimisation settings (``trainer.*``, the one definition of their defaults); epochs are maxima,
    each phase stops early on held-out NLL."""

    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.0
    delta_l2: float = 0.01
    pretrain_epochs: int = 100
    finetune_epochs: int = 100
    patience: int = 20
    val_fraction: float = 0.2
    temperature_scaling: bool = True
    ordinal_blend: bool = True
    accelerator: str = "auto"

    def __post_init__(self):
        """Each setting checked (and converted) here, named ``trainer.<field>`` in the error."""
        if self.accelerator not in ACCELERATORS:
            raise InputError(f"{self.accelerator!r} is not one of {list(ACCELERATORS)}", setting="trainer.accelerator")
        for name, (low, integer, open_low, high) in LIMITS.items():
            setattr(
                self,
                name,
                check_range(
                    f"trainer.{name}",
                    getattr(self, name),
                    low,
                    high,
                    open_low=open_low,
                    integer=integer,
                    open_high=name == "val_fraction",
                ),
            )
        for name in ("temperature_scaling", "ordinal_blend"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{getattr(self, name)!r} is not true or false", setting=f"trainer.{name}")

    @classmethod
    def from_dict(cls, data: dict | None) -> TrainConfig:
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"unknown trainer setting(s) {unknown}; known: {sorted(known)}", setting=f"trainer.{unknown[0]}"
            )
        return cls(**data)


LIMITS = {  # field: (lower bound, integer, lower bound excluded, upper bound)
    "batch_size": (1, True, False, None),
    "lr": (0, False, True, None),
    "weight_decay": (0, False, False, None),
    "delta_l2": (0, False, False, None),
    "pretrain_epochs": (0, True, False, None),
    "finetune_epochs": (0, True, False, None),
    "patience": (1, True, False, None),
    "val_fraction": (0, False, False, 1),
}


AUTO_CANDIDATES = ("network", "clmm_own", "clmm_all", "clmm_mean", "ridge_judge")


@dataclass
class AutoConfig:
    """``model=auto`` (:mod:`llmrubric.model.auto`): candidate families compared by inner cross-validation.

    Attributes:
        candidates: names of :data:`llmrubric.model.auto.CANDIDATES` (``network`` is the network of
            the other ``model.*`` settings).
        rule: ``select`` (the candidate with the lowest inner-CV NLL) or ``stack`` (non-negative
            weights summing to 1 that maximise the inner-CV likelihood of the main question);
            ``select`` had the lower pair NLL on all four design protocols of ``benchmarks/auto.py``
            (synthetic DS1..DS5 and the simulated 12-system set, leave one system out and system groups).
        group: inner folds by ``text`` or ``system``; ``auto``: by system under the protocols that
            score unseen systems (``systems``, ``system_groups``), else by text.
        folds: inner folds (by system: at most one per training system).
    """

    candidates: list[str] = field(default_factory=lambda: list(AUTO_CANDIDATES))
    rule: str = "select"
    group: str = "auto"
    folds: int = 5


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
            (:mod:`llmrubric.model.cumulative`); ``monotone`` applies to the latter two.
        family: ``network`` (this network alone) or ``auto`` (the model chosen by inner
            cross-validation among ``auto.candidates``, :class:`AutoConfig`).
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


MISSING = "???"  # OmegaConf's mark of a setting without a default, which each file must set


@dataclass
class DataConfig:
    """A data set (``data.*``, ``conf/data/``): ``train`` and ``test`` are the ``_target_`` calls that
    load their tables (``llmrubric.io.tables.load_tables``, ``llmrubric.data.llm_rubric.load``);
    ``test`` None: the protocol splits the training texts. ``root``: a folder the calls may share."""

    name: str = MISSING
    train: Any = MISSING
    test: Any = None
    root: str | None = None


@dataclass
class SearchConfig:
    """Optuna search (``search.*``, :mod:`llmrubric.experiments.search`); ``search=optuna`` turns it on
    and sets the space. Each training split (the outer folds under ``protocol=cv``: nested CV) gets
    its own study; the selected configuration is refitted on the whole split.

    Attributes:
        n_trials: finished trials per study (a resumed study continues to this count).
        batch: trials asked at once (TPE, constant liar) and trained as one stacked program.
        ensemble: networks per fold model while searching (the refit uses ``model.ensemble``).
        patience: early-stopping patience while searching (the refit uses ``trainer.patience``).
        inner_folds: selection by k-fold CV of the training texts, split by ``text_id``.
        seed: the TPE sampler's seed: the search is reproducible from its config.
        startup_trials: random trials before TPE (and the median pruner's warm-up in trials).
        pruner: ``successive_halving`` (Optuna's ASHA) or ``median``.
        pruner_warmup_epochs: epochs before a trial can be pruned (the first rung).
        reduction_factor: successive halving keeps the best 1/3 at epochs 10, 30, 90, 270.
        storage: the study's database; ``postgresql://user@host/db`` for several machines.
        heartbeat_seconds: running trials beat; a resumed search re-queues the trials of a killed one.
        space: ``model.*`` / ``trainer.*`` settings searched; types categorical, int, float.
    """

    enabled: bool = False
    n_trials: int = 100
    batch: int = 10
    ensemble: int = 1
    patience: int | None = 10
    inner_folds: int = 5
    seed: int = 0
    startup_trials: int = 10
    pruner: str = "successive_halving"
    pruner_warmup_epochs: int = 10
    reduction_factor: int = 3
    storage: str | None = "sqlite:///${run_dir}/optuna.db"
    heartbeat_seconds: int = 60
    progress: bool = True
    space: dict[str, Any] = field(default_factory=dict)


REPORT_SECTIONS = ("table1", "calibration", "ablations", "per_question", "oracles", "learning_curve")


@dataclass
class ReportConfig:
    """The evaluation report (``report.*``; ``report=full`` as defined here, ``fast`` for tests and
    smoke runs, ``none``), checked by :class:`llmrubric.report.settings.ReportSettings`. Every variant
    is trained anew under the experiment's protocol with its model/trainer settings; seeds, shares
    and repetitions are sized for the LLM-Rubric real-data report to fit in 15 minutes on 2 cores.

    Attributes:
        dir: where report.md, report.html, report.json, CSVs and figures/ are written.
        methods: Table 1 rows; None: every method of :data:`llmrubric.model.baselines.METHODS`.
        seeds: seeds per learned variant; a method's prediction is the mean over its seeds.
        workers: training processes (one torch thread each).
        seed: seeds permutations and bootstraps.
        permutations: paired permutation test (one-sided, swaps per pair).
        bootstrap: percentile bootstrap resamples of every metric.
        alpha, confidence: significance level of the marks; bootstrap interval level.
        calibration_bootstrap: resamples of each smECE interval (relplot itself uses 100).
        calibration_min_examples: smallest judge / system group calibrated separately.
        diagram_bootstrap: bootstrap curves of each reliability diagram's band.
        judge_figure_min_pairs: smallest judge shown in the judge-distribution figure.
        ablation_questions: feature questions left out one at a time; None: every question with LLM features.
        per_question: target questions of Table 3; None: every rubric question.
        lc_fractions: shares of the training texts (the paper: 10 %, 20 %, …, 100 %, 50 repetitions).
        lc_repetitions: repetitions (sample and seed) per share of training data.
        depersonalized_min_coverage: rows e, f need this share of held-out pairs with a second judge on the text.
        model: overrides of the experiment's model settings for every variant of the report.
    """

    name: str = "full"
    enabled: bool = True
    dir: str = "${run_dir}/report"
    sections: list[str] = field(default_factory=lambda: list(REPORT_SECTIONS))
    methods: list[str] | None = None
    seeds: int = 2
    workers: int = 2
    seed: int = 0
    permutations: int = 10_000
    bootstrap: int = 1000
    alpha: float = 0.05
    confidence: float = 0.95
    calibration_bootstrap: int = 200
    calibration_min_examples: int = 30
    diagram_bootstrap: int = 100
    judge_figure_min_pairs: int = 15
    ablation_questions: list[str] | None = None
    per_question: list[str] | None = None
    lc_fractions: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0])
    lc_repetitions: int = 3
    depersonalized_min_coverage: float = 0.5
    model: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    """MLflow tracking (``logger.*``, :mod:`llmrubric.experiments.tracking`); ``logger=none`` turns it off.

    Attributes:
        experiment: the MLflow experiment, one per experiment config.
        tracking_uri: None: ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlruns.db`` (artifacts in mlartifacts/ beside it).
    """

    enabled: bool = True
    experiment: str = "${name}"
    tracking_uri: str | None = None


@dataclass
class LeaderboardConfig:
    """System leaderboards (``leaderboard.*`` of the scoring settings).

    Attributes:
        question: None: the checkpoint's (rubric's) main question.
        bootstrap: replicates; texts and judges resampled, answers drawn from p̂_a.
        alpha: intervals are 1 - alpha.
        sample_answers: False: replicates use expected answers (no answer sampling).
        band_replicates: replicates kept for the density plot's uncertainty bands.
        missing_systems: a system absent from the reference leaderboard: ``error`` or ``drop`` (warned).
        small_sample: label intervals (classical, PPI, PPI++): ``student`` widens ppi_py's normal
            interval to Student's t_{k-1} with Bessel's correction (k labels); ``normal`` keeps the library's.
    """

    question: str | None = None
    bootstrap: int = 1000
    seed: int = 0
    alpha: float = 0.05
    sample_answers: bool = True
    band_replicates: int = 200
    missing_systems: str = "error"
    small_sample: str = "student"


@dataclass
class ScoringConfig:
    """Scoring new texts with a trained calibrator and system leaderboards (LLM-Rubric Appendix A):
    ``llmrubric score texts`` and ``llmrubric leaderboard build`` (``conf/scoring/``, ``--config``).

    Attributes:
        trusted_judges: the trusted set A; None: every judge known to the checkpoint.
        questions: questions to score; None: every ordered rubric question (categorical ones have no score).
        quantile: judge-free quantile over A, reported beside mean and max.
        chunk_texts: texts per chunk; memory is bounded by chunk_texts × |A| pairs.
    """

    trusted_judges: list[str] | None = None
    questions: list[str] | None = None
    quantile: float = 0.9
    chunk_texts: int = 4096
    leaderboard: LeaderboardConfig = field(default_factory=LeaderboardConfig)


@dataclass
class SuggestConfig:
    """``llmrubric label suggest``.

    Attributes:
        floor: share of each draw's probability spread uniformly over the system's texts (every text can be drawn).
        seed: seeds the draws; give each round its own.
        round: the round the drawn texts are labelled in (annotations' ``round`` column).
        question: whose predicted variance ranks the texts; None: the rubric's main question.
    """

    floor: float = 0.2
    seed: int = 0
    round: str = "1"
    question: str | None = None


@dataclass
class JudgesConfig:
    """``llmrubric judges add``.

    Attributes:
        min_annotations: fewest answers of the main question that a judge is fitted from.
        l2: L2 on the new judge's parameters: a number, None (the checkpoint's ``trainer.delta_l2``)
            or ``cv``: the value of ``l2_grid`` with the lowest cross-validated NLL on the judge's own texts.
        cv_folds: folds over the judge's annotated texts (fewer texts: one per fold).
        max_iter: L-BFGS iterations of the fit (full batch, shared parameters frozen).
    """

    min_annotations: int = 5
    l2: Any = "cv"
    l2_grid: list[float] = field(default_factory=lambda: [0.001, 0.01, 0.1, 1.0, 10.0])
    cv_folds: int = 5
    max_iter: int = 200


@dataclass
class LabelsConfig:
    """Human labels of new systems and new judges (``conf/labels/``, ``--config``); the leaderboard's
    label intervals take their alpha and small_sample from :class:`LeaderboardConfig`."""

    suggest: SuggestConfig = field(default_factory=SuggestConfig)
    judges: JudgesConfig = field(default_factory=JudgesConfig)


@dataclass
class AutograderConfig:
    """The RUBRIC autograder (``autograder.*`` of the IR settings).

    Attributes:
        family: item family of the extracted grades (question ids ``<family>:<item_id>``).
        grade: ``argmax`` or ``expected`` grade of each item's distribution.
        rule: passage label: ``max`` grade over items or ``at_least_m`` (the m-th highest grade).
        grade_range: the self-rating scale: a grade outside it is an error.
        threshold: τ: a label/grade >= τ counts as relevant / covering.
        cover_k: Rubric-Cover@k.
        judged_relevant: human judgments >= this are relevant (verification analyses).
    """

    family: str = "self_rating"
    grade: str = "argmax"
    rule: str = "max"
    m: int = 1
    grade_range: list[Any] = field(default_factory=lambda: [0, 5])
    threshold: Any = 4
    measures: list[str] = field(default_factory=lambda: ["nDCG@10", "AP", "RR", "P@10"])
    cover_k: int = 10
    judged_relevant: int = 1


@dataclass
class NuggetsConfig:
    """AutoNuggetizer scores; ``partial_weight``: credit of partial_support in the partial variants."""

    family: str = "nugget_support"
    partial_weight: float = 0.5


@dataclass
class IRConfig:
    """IR evaluations (:mod:`llmrubric.ir`; ``conf/ir/``, ``--config``). ``grounded_qa``: ``family``,
    ``lambda`` (combined = lambda × answer + (1 - lambda) × evidence; a Python keyword, hence a mapping)
    and ``recall_at``."""

    autograder: AutograderConfig = field(default_factory=AutograderConfig)
    nuggets: NuggetsConfig = field(default_factory=NuggetsConfig)
    grounded_qa: dict[str, Any] = field(
        default_factory=lambda: {"family": "answer_quality", "lambda": 0.5, "recall_at": [1, 5]}
    )


@dataclass
class AdaptiveConfig:
    """The adaptive rubric (``extract features --adaptive``, ``rubric plan``; docs/adaptive.md): per text,
    ask next the block whose answer is expected to reduce the variance of the main question's
    predicted score most per unit cost; stop at ``budget`` calls or when that reduction falls below
    ``min_gain``.

    Attributes:
        budget: most LLM calls (blocks asked) per text; None: every block of the calibrator.
        min_gain: stop when the best expected variance reduction per unit cost is below this
            (squared score units; 0: stop only at the budget or when no block is left).
        cost: ``calls`` (each block costs 1) or ``tokens`` (a block costs its prompt's length in
            characters over the mean prompt length of the text's blocks).
        draws: the answer model's guesses of a block's answer that each expected reduction averages over.
        judges: whose mean predicted score is the target; None: the average over every judge of the
            calibrator (as ``score texts`` with no trusted judges).
        seed: seeds the answer model's guesses.
    """

    budget: int | None = None
    min_gain: float = 0.0
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


GROUP_SCHEMAS = {
    "data": DataConfig,
    "model": ModelConfig,
    "trainer": TrainConfig,
    "search": SearchConfig,
    "report": ReportConfig,
    "logger": LoggerConfig,
    "scoring": ScoringConfig,
    "labels": LabelsConfig,
    "ir": IRConfig,
    "extract": ExtractConfig,
}
OPEN_GROUPS = ("extract",)  # a file may add keys the schema does not name (the backends' own)


def model_settings(model: dict | ModelConfig | None = None) -> dict:
    """:class:`ModelConfig`'s defaults updated by ``model`` (unknown keys are kept, for the caller to reject)."""
    from omegaconf import Container, OmegaConf

    given = asdict(model) if isinstance(model, ModelConfig) else dict(model or {})
    plain = lambda v: OmegaConf.to_container(v, resolve=True) if isinstance(v, Container) else v
    given = {k: asdict(v) if isinstance(v, AutoConfig) else plain(v) for k, v in given.items()}
    return {**asdict(ModelConfig()), **given}


def model_overrides(name: str) -> dict:
    """What ``conf/model/<name>.yaml`` sets over :class:`ModelConfig`'s defaults (``model_overrides("paper")``:
    the paper's network), read without composing (so also inside a running Hydra app; the file's
    only default is the schema)."""
    import yaml

    data = yaml.safe_load(conf_path("model", f"{name}.yaml").read_text()) or {}
    return {k: v for k, v in data.items() if k != "defaults"}


def model_file(name: str) -> dict:
    """The settings of ``conf/model/<name>.yaml`` over :class:`ModelConfig`'s defaults."""
    return model_settings(model_overrides(name))


def conf_path(*parts: str) -> Path:
    """A file or folder of the shipped ``conf/`` (``conf_path("rubric", "llm_rubric.yaml")``),
    found with :mod:`importlib.resources` in a checkout and in an installed wheel alike."""
    return Path(str(importlib.resources.files(CONF_PACKAGE).joinpath(*parts)))


def register_configs() -> None:
    """Store the structured configs in Hydra's ConfigStore (done before every composition)."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for name, schema in GROUP_SCHEMAS.items():
        store.store(group="schemas", name=name, node=schema)


def compose(
    config_name: str = "config", overrides: list[str] | tuple[str, ...] = (), config_dir: str | Path | None = None
):
    """The composed settings (a DictConfig) of ``config_name`` with Hydra ``overrides``.

    ``config_dir``: compose a file of that folder (its ``defaults`` may name sibling files) instead
    of the shipped ``conf/``. Errors name the setting.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir, initialize_config_module
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    if config_dir is not None:
        context = initialize_config_dir(config_dir=str(Path(config_dir).resolve()), version_base=VERSION_BASE)
    else:
        context = initialize_config_module(CONF_PACKAGE, version_base=VERSION_BASE)
    try:
        with context:
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except OmegaConfBaseException as e:
        raise settings_error(e) from None
    except HydraException as e:
        cause = e.__cause__ if isinstance(e.__cause__, OmegaConfBaseException) else None
        raise (settings_error(cause) if cause is not None else InputError(" ".join(str(e).split()))) from None


def settings_error(e: Exception) -> InputError:
    """An OmegaConf validation error as an :class:`InputError` naming the setting."""
    message = str(getattr(e, "msg", None) or e).splitlines()[0]
    key = getattr(e, "full_key", None)
    return InputError(message, setting=key) if key else InputError(message)


def load_file(path: str | Path, overrides: list[str] | tuple[str, ...] = (), what: str = "settings file") -> dict:
    """A settings file of the user's (``--config``) composed like the shipped ones, as a plain dict:
    its ``defaults`` list may name files of its folder, ``overrides`` apply on top."""
    import yaml
    from omegaconf import OmegaConf

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} not found", file=str(path))
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"not valid YAML: {' '.join(str(e).split())}", file=str(path)) from None
    if not isinstance(data, dict | None):
        raise InputError(f"a {what} must be a YAML mapping (key: value lines)", file=str(path))
    try:
        cfg = compose(path.stem, overrides, config_dir=path.parent)
    except InputError as e:
        raise InputError(f"cannot compose the {what}: {e}", file=str(path)) from None
    return OmegaConf.to_container(cfg, resolve=True)


def command_settings(
    group: str,
    path: str | Path | None = None,
    flags: dict | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    what: str = "settings file",
) -> dict:
    """The settings of a CLI command of the config group ``group`` (``scoring``, ``labels``, ``ir``,
    ``extract``) as a plain dict: the group's typed defaults (:data:`GROUP_SCHEMAS`), under its
    ``--config`` file ``path`` or else the shipped ``conf/<group>/default.yaml`` (composed by
    :func:`load_file` with the Hydra ``overrides``), under the command-line ``flags``
    (``{"leaderboard.bootstrap": 200}``; None means not given). A bad value names the setting."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    default = conf_path(group, "default.yaml")
    if path is not None:
        given = load_file(path, overrides, what)
    else:
        given = load_file(default, overrides, what) if default.is_file() else {}
    schema = OmegaConf.structured(GROUP_SCHEMAS[group])
    OmegaConf.set_struct(schema, group not in OPEN_GROUPS)
    flat = {key: value for key, value in (flags or {}).items() if value is not None}
    settings = schema
    for layer, source in ((given, path or default), (_nested(flat), None)):
        try:
            settings = OmegaConf.merge(settings, layer)
        except OmegaConfBaseException as e:
            message = str(getattr(e, "msg", None) or e).splitlines()[0]
            key = getattr(e, "full_key", None) or None
            raise InputError(message, file=str(source) if source else None, setting=key) from None
    return OmegaConf.to_container(settings, resolve=True)


def _nested(flat: dict) -> dict:
    """``{"a.b": 1}`` as ``{"a": {"b": 1}}``."""
    out: dict = {}
    for key, value in flat.items():
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def group(name: str, option: str = "default", overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """One group's settings as a plain dict, as the apps see them: ``group("model", "paper")``."""
    from omegaconf import OmegaConf

    cfg = compose("config", [f"{name}={option}", *(f"{name}.{o}" for o in overrides)])
    return OmegaConf.to_container(cfg[name], resolve=True)


def run_app(task, name: str, argv: list[str] | None = None) -> None:
    """Run the Hydra app ``task`` (a ``hydra.main`` function) as ``llmrubric <name> argv…``.

    Plain overrides are composed first, so that a bad one is one ``error:`` line (exit 2) like
    every other bad setting; Hydra's flags (``--cfg job``, ``--multirun``, ``--help``) pass through.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    register_configs()
    if not any(a.startswith("-") for a in argv):
        try:
            compose("config", argv)
        except InputError as e:
            sys.exit(report(e))
    saved = sys.argv
    sys.argv = [name, *argv, f"hydra.job.name={name}"]
    try:
        task()
    finally:
        sys.argv = saved
