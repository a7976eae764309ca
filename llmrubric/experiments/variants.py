"""The report's experiments, all under one protocol: Table 1 methods, ablations (Table 2),
per-question fine-tuning (Table 3), oracles (Table 1 rows a–f) and learning curves (Appendix J).

A :class:`Variant` declares one method (a Table 1 method, or the calibration network with
some settings changed). :func:`run_variants` trains every (variant, seed, split) job of
the protocol's splits (CV folds or train → test) and returns the held-out predictions of
each variant's target question, concatenated over splits. All fits of one variant train
together (stacked networks); variants run in a process pool (one torch thread each) with a
progress bar.
"""

from __future__ import annotations

import logging
import os
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from tqdm import tqdm

from llmrubric.experiments.experiment import Split
from llmrubric.io.errors import InputError
from llmrubric.io.predictions import option_columns
from llmrubric.io.rubric import Rubric
from llmrubric.io.tables import Tables
from llmrubric.model.core.encoding import PAIR, JudgeMap, with_round
from llmrubric.model.core.params import prefixed
from llmrubric.model.core.registry import capabilities, make, names
from llmrubric.model.core.threads import one_thread, single_threaded
from llmrubric.model.families.baselines import deterministic_methods
from llmrubric.model.families.oracles import PersonalIsotonic

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """One method to train and evaluate.

    Args:
        name: unique name in the report.
        method: a Table 1 method (:func:`llmrubric.model.families.baselines.report_methods`); the knobs below need ``llm_rubric``.
        question: the target (fine-tuned, evaluated) question; None: the rubric's main question.
        model, trainer: ``(key, value)`` overrides of the network / trainer settings.
        drop_questions: feature blocks left out (ablations).
        oracle: None, ``"own"`` (the judge's own answers to the other questions as input) or
            ``"others"`` (the other judges' mean answers).
        llm_features: False: the oracle answers are the only input.
        isotonic: correct the point predictions per judge by isotonic regression.
        fraction: share of the training texts used (learning curves); the sample is seeded by the run's seed.
    """

    name: str
    method: str = "llm_rubric"
    question: str | None = None
    model: tuple = ()
    trainer: tuple = ()
    drop_questions: tuple[str, ...] = ()
    oracle: str | None = None
    llm_features: bool = True
    isotonic: bool = False
    fraction: float = 1.0

    @property
    def single_run(self) -> bool:
        """Methods without training randomness run once (seed 0): the deterministic ones and ``random``
        (its seed draws only its point predictions, not its distribution)."""
        return (self.method in deterministic_methods() or self.method == "random") and not self.isotonic

    def check(self, rubric: Rubric) -> None:
        if self.method not in names():
            raise InputError(f"variant {self.name!r}: unknown method {self.method!r}; known: {names()}")
        knobs = self.model or self.trainer or self.drop_questions or self.oracle or not self.llm_features
        if knobs and self.method != "llm_rubric":
            raise InputError(f"variant {self.name!r}: settings can only be changed for llm_rubric, not {self.method!r}")
        if self.question is not None and self.question not in rubric:
            raise InputError(f"variant {self.name!r}: question {self.question!r} is not in the rubric {rubric.ids}")
        if self.oracle not in (None, "own", "others"):
            raise InputError(f"variant {self.name!r}: oracle must be 'own' or 'others', not {self.oracle!r}")
        if not 0 < self.fraction <= 1:
            raise InputError(f"variant {self.name!r}: fraction must be in (0, 1], got {self.fraction}")

    def build(self, rubric: Rubric, seed: int, model: dict, trainer: dict):
        """The unfitted estimator (``fit(tables)``, ``predict(tables)``): the registry's ``method`` of the
        ``model``/``trainer`` sections, or with the knobs the network of them with the knobs as its parameters."""
        rubric = rubric.with_main(self.question) if self.question else rubric
        params = self.params()
        name = "network" if params else self.method
        estimator = make(name, rubric, model, trainer, seed, params=params)
        return PersonalIsotonic(estimator, rubric) if self.isotonic else estimator

    def params(self) -> dict:
        """The knobs as the network's parameters (:meth:`Family.get_params`'s keys)."""
        inputs = {"drop_questions": list(self.drop_questions)} if self.drop_questions else {}
        if self.oracle or not self.llm_features:
            inputs.update(oracle=self.oracle, llm_features=self.llm_features)
        return {**prefixed("model", dict(self.model)), **prefixed("trainer", dict(self.trainer)), **inputs}


def subsample_texts(text_ids: list[str], fraction: float, seed: int) -> list[str]:
    """A seeded random ``fraction`` of the texts (at least two)."""
    texts = sorted(text_ids)
    if fraction >= 1:
        return texts
    n = max(2, int(round(fraction * len(texts))))
    return sorted(np.random.default_rng(seed).choice(texts, size=min(n, len(texts)), replace=False).tolist())


@dataclass
class _Study:
    """What every job of :func:`run_variants` trains on."""

    rubric: Rubric
    splits: list[Split]
    model: dict
    trainer: dict


def _init_worker() -> None:
    """A worker process: one thread, no warnings, errors only from llmrubric's loggers."""
    single_threaded()
    warnings.filterwarnings("ignore")
    logging.getLogger("llmrubric").setLevel(logging.ERROR)


def _fit(estimators: list, trains: list[Tables]) -> None:
    """Fit estimators on their training tables; calibration networks of one variant train as one stacked program."""
    cores = [e.base if capabilities(e).corrects else e for e in estimators]  # an isotonic correction's base model
    if all(capabilities(c).joint_fit and type(c) is type(cores[0]) for c in cores):
        judge_sets = {tuple(sorted(t.annotations.judge_id.unique())) for t in trains}
        judges = JudgeMap.from_annotations(pd.concat([t.annotations for t in trains])) if len(judge_sets) > 1 else None
        cores[0].fit_many(cores, trains, judges)
    else:
        for core, train in zip(cores, trains):
            core.fit(train)
    for estimator, train in zip(estimators, trains):
        if capabilities(estimator).corrects:  # the isotonic correction of a base fitted above
            estimator.calibrate(train)


def _run_job(
    study: _Study, variant: Variant, runs: list[tuple[int, int]], base_name: str | None
) -> dict[tuple[str, int, int], pd.DataFrame]:
    """Fit one variant for every (seed, split) of ``runs``; {(name, seed, split): held-out predictions of its question}.

    For an isotonic variant, ``base_name`` also receives the uncorrected model's predictions
    (the same fitted model), so the base variant is not trained twice.
    """
    rubric, splits = study.rubric, study.splits
    trains = []
    for seed, k in runs:
        train = splits[k].train
        trains.append(
            train.subset(subsample_texts(train.text_ids, variant.fraction, seed)) if variant.fraction < 1 else train
        )
    estimators = [variant.build(rubric, seed, study.model, study.trainer) for seed, _ in runs]
    _fit(estimators, trains)
    question = variant.question or rubric.main.id
    outputs = {}
    for (seed, k), estimator in zip(runs, estimators):
        test = splits[k].test
        outputs[(variant.name, seed, k)] = estimator.predict(test)
        if base_name is not None:
            outputs[(base_name, seed, k)] = estimator.base.predict(test)
    return {key: p[p.question_id == question].reset_index(drop=True) for key, p in outputs.items()}


def run_variants(
    requests: dict[Variant, int], rubric: Rubric, splits: list[Split], model: dict, trainer: dict, workers: int = 1
) -> dict[tuple[str, int], pd.DataFrame]:
    """Held-out predictions of every requested variant and seed: ``{(name, seed): predictions of its question}``.

    ``requests`` maps each variant to its number of seeds (``0..n-1``; one run if it has no
    training randomness). Every split is trained; predictions are concatenated over the
    splits' test sets. All seeds and splits of one calibration-network variant are fitted
    together (one stacked program, the family's ``fit_many``, capability ``joint_fit``; with one
    judge map, the union of the training sets' judges, when these differ); a variant that
    is another requested variant plus isotonic correction shares its fitted models. One
    job per variant; jobs run in ``workers`` processes.
    """
    names = [v.name for v in requests]
    if len(set(names)) != len(names):
        raise InputError(f"different variants share a name: {sorted({n for n in names if names.count(n) > 1})}")
    for variant in requests:
        variant.check(rubric)
    unnamed = {replace(v, name=""): v for v in requests}
    bases = {v: unnamed.get(replace(v, name="", isotonic=False)) if v.isotonic else None for v in requests}
    derived = {b: v for v, b in bases.items() if b is not None and requests[b] <= requests[v]}
    jobs = [
        (
            v,
            [(seed, k) for seed in ([0] if v.single_run else range(n)) for k in range(len(splits))],
            bases[v].name if derived.get(bases[v]) is v else None,
        )
        for v, n in requests.items()
        if v not in derived
    ]
    jobs.sort(key=lambda job: job[0].single_run)
    results: dict[tuple[str, int], list] = {}

    def collect(outputs):
        for (name, seed, k), frame in outputs.items():
            results.setdefault((name, seed), []).append((k, frame))
        progress.update()

    progress = tqdm(total=len(jobs), desc="training", unit="variant")
    study = _Study(rubric, splits, model, trainer)
    if workers <= 1:
        level = logging.getLogger("llmrubric").level
        try:
            with warnings.catch_warnings(), one_thread(blas=True):
                warnings.filterwarnings("ignore")
                logging.getLogger("llmrubric").setLevel(logging.ERROR)
                for job in jobs:
                    collect(_run_job(study, *job))
        finally:
            logging.getLogger("llmrubric").setLevel(level)
    else:
        with ProcessPoolExecutor(min(workers, os.cpu_count() or 1), initializer=_init_worker) as pool:
            futures = [pool.submit(_run_job, study, *job) for job in jobs]
            for future in as_completed(futures):
                collect(future.result())
    progress.close()
    return {
        key: pd.concat([frame for _, frame in sorted(parts, key=lambda p: p[0])], ignore_index=True)
        for key, parts in results.items()
    }


def ensemble(frames: list[pd.DataFrame], rubric: Rubric, question: str) -> pd.DataFrame:
    """Seed-averaged predictions: the mean of the seeds' distributions and point predictions per pair."""
    q = rubric[question]
    p_cols = [f"p_{k}" for k in q.keys]
    if len(frames) == 1:
        return frames[0]
    stacked = pd.concat([with_round(f) for f in frames], ignore_index=True)
    keys = PAIR + ["question_id"] + (["system_id"] if "system_id" in stacked.columns else [])
    out = stacked.groupby(keys, sort=False, dropna=False)[p_cols + ["mean"]].mean().reset_index()
    p = out[p_cols].to_numpy(float)
    values = np.asarray(q.values, float)
    out["var"] = p @ values**2 - (p @ values) ** 2
    columns = keys + [c for c in option_columns(rubric, [q]) if c in out.columns] + ["mean", "var"]
    return out[columns]


def table1_variants(methods: list[str]) -> list[Variant]:
    return [Variant(m, method=m) for m in methods]


ABLATIONS = {"no_finetuning": (("finetune_epochs", 0),), "no_pretraining": (("pretrain_epochs", 0),)}


def ablation_variants(rubric: Rubric, feature_questions: list[str]) -> dict[str, Variant]:
    """Table 2: the full model and one variant per design decision and per feature question left out."""
    out = {
        "LLM-Rubric": Variant("llm_rubric"),
        "w/o fine-tuning": Variant("no_finetuning", trainer=ABLATIONS["no_finetuning"]),
        "w/o pre-training": Variant("no_pretraining", trainer=ABLATIONS["no_pretraining"]),
        "w/o personalization": Variant("no_personalization", method="no_personalization"),
    }
    for q in feature_questions:
        name = rubric[q].name
        out[f"w/o {q}" + (f" ({name})" if name else "")] = Variant(f"without_{q}", drop_questions=(q,))
    return out


def per_question_variants(rubric: Rubric, questions: list[str]) -> dict[str, tuple[Variant, Variant]]:
    """Table 3: (LLM-Rubric fine-tuned on q, expected LLM answer to q) for each question."""
    out = {}
    for q in questions:
        model = Variant("llm_rubric") if q == rubric.main.id else Variant(f"llm_rubric_{q}", question=q)
        base = (
            Variant("expected_llm", method="expected_llm")
            if q == rubric.main.id
            else Variant(f"expected_llm_{q}", method="expected_llm", question=q)
        )
        out[q] = (model, base)
    return out


def oracle_variants(depersonalized: bool) -> dict[str, Variant]:
    """Table 1 rows a–f (e and f only where texts have several judges)."""
    no_pers = (("personalize", False),)
    out = {
        "a": ("Oracle", Variant("oracle", oracle="own")),
        "b": ("w/o LLM probs", Variant("oracle_no_llm", oracle="own", llm_features=False)),
        "c": ("w/o personalized calibration", Variant("oracle_no_personalization", oracle="own", model=no_pers)),
        "d": (
            "↳ + personalized isotonic regression",
            Variant("oracle_no_personalization_isotonic", oracle="own", model=no_pers, isotonic=True),
        ),
    }
    if depersonalized:
        out["e"] = ("Depersonalized oracle", Variant("depersonalized_oracle", oracle="others", model=no_pers))
        out["f"] = (
            "↳ + personalized isotonic regression",
            Variant("depersonalized_oracle_isotonic", oracle="others", model=no_pers, isotonic=True),
        )
    return out


def learning_curve_variants(fractions: list[float]) -> dict[float, Variant]:
    """Appendix J: LLM-Rubric trained on a seeded random share of the training texts."""
    return {
        f: (Variant("llm_rubric") if f >= 1 else Variant(f"llm_rubric_{round(100 * f)}pct", fraction=f))
        for f in fractions
    }
