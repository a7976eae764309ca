"""Label rules (issue 42, item 4): held-out Cohen's κ and quadratic κ of argmax labels and of the rule chosen
by ``model=auto``'s inner cross-validation, under each objective.

    .venv/bin/python benchmarks/label_rules.py [--sets demo lowered_1.0 lowered_1.5 lowered_1.5_600 weak_600]

Each set is split 70/30 by text (``holdout_texts``, seed 0); ``model=auto`` with the shipped settings is
fitted on the 70 %; every rule of :mod:`llmrubric.model.core.label_rule` (and the choice among them by
``kappa`` and by ``qwk``) is fitted on its out-of-fold predictions (``label_oof_``) and labels the 30 %.
``demo`` is ``data/simulated``; the others are :func:`llmrubric.data.simulate.simulate` with every system's
latent quality lowered (most answers the lowest grade), ``weak`` with one noisy LLM source (diffuse
distributions). Writes ``benchmarks/results/label_rules.json``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import code_version, exit_code, write_result  # noqa: E402
from llmrubric.config import LABEL_RULES, model_file  # noqa: E402
from llmrubric.data.simulate import SYSTEMS, simulate  # noqa: E402
from llmrubric.data.splits import holdout_texts  # noqa: E402
from llmrubric.evaluation.metrics import label_metrics  # noqa: E402
from llmrubric.io.rubric import Rubric  # noqa: E402
from llmrubric.io.tables import load_tables  # noqa: E402
from llmrubric.model.auto import AutoCalibrator  # noqa: E402
from llmrubric.model.core.encoding import question_targets  # noqa: E402
from llmrubric.model.core.label_rule import choose_rule  # noqa: E402
from llmrubric.model.core.threads import one_thread  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "label_rules.json"
WEAK = {"source": "llm", "bias": (0.3, 0.3), "slope": (0.3, 0.6), "noise": 2.5, "temperature": 0.6}
SETS = {  # name: (simulation seed, texts, lowered by, sources)
    "lowered_1.0": (2, 300, 1.0, None),
    "lowered_1.5": (1, 300, 1.5, None),
    "lowered_1.5_600": (3, 600, 1.5, None),
    "weak_600": (4, 600, 1.5, (WEAK,)),
}


def load(name: str, rubric: Rubric):
    if name == "demo":
        d = ROOT / "data" / "simulated"
        return load_tables(d / "annotations.csv", d / "features.csv", rubric, d / "texts.csv")
    seed, n, lowered, sources = SETS[name]
    systems = {k: (tuple(m - lowered for m in means), refs) for k, (means, refs) in SYSTEMS.items()}
    return simulate(seed, n, 12, 3, rubric, systems=systems, **({"sources": sources} if sources else {}))[0]


def measure(name: str, rubric: Rubric) -> dict:
    tables = load(name, rubric)
    train_ids, test_ids = holdout_texts(tables.text_ids, 0.3, seed=0)
    train, test = tables.subset(train_ids), tables.subset(test_ids)
    model = AutoCalibrator(rubric, model_file("auto"), seed=0).fit(train)
    question = rubric.main
    pairs, answers = question_targets(test, question)
    probs = model.predict_proba(test, pairs)[:, rubric.ids.index(question.id), : len(question.options)]
    figures = {}
    for objective in ("kappa", "qwk"):
        for rules in [list(LABEL_RULES)] + [[r] for r in LABEL_RULES]:
            rule = choose_rule(*model.label_oof_, question.values, rules, objective)
            key = f"{objective}/chosen" if len(rules) > 1 else f"{objective}/{rules[0]}"
            labels = rule.indices(probs, question.values)
            figures[key] = {"rule": rule.name, **label_metrics(answers, labels, question.values)}
    _, train_answers = question_targets(train, question)
    shares = (train_answers[:, None] == range(len(question.options))).mean(axis=0)
    return {"answer_shares": shares.round(3).tolist(), "weights": model.weights_, "test": figures}


def run(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["demo", *SETS], choices=["demo", *SETS])
    args = parser.parse_args(argv)
    version = code_version()
    rubric = Rubric.load(ROOT / "conf" / "rubric" / "llm_rubric.yaml")
    result = {}
    with one_thread(blas=True):
        for name in args.sets:
            result[name] = measure(name, rubric)
            chosen = {k: (v["rule"], round(v["kappa"], 3), round(v["qwk"], 3)) for k, v in result[name]["test"].items()}
            print(name, chosen, flush=True)
    write_result(result, OUT, version)
    print(f"written to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(run, None))
