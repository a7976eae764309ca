"""``llmrubric rubric plan``: simulate the adaptive rubric on a features table before paying for calls.

For each budget (calls per text) it prints and writes the blocks the adaptive rubric would ask and the
expected quality of the main score: its expected standard deviation given the blocks asked (from the
calibrator's answer model), its RMSE and Pearson against the score with every block of the table,
and, with ``--annotations``, the main question's pair NLL and Pearson; a last row applies the stop rule
(``min_gain``). Settings: the ``adaptive`` section of an extract config (``--config``), flags over it.
"""

from __future__ import annotations

import logging

from llmrubric.apps.commands import add_noun
from llmrubric.io.errors import InputError

log = logging.getLogger(__name__)
COLUMNS = ("rule", "mean_calls", "share_of_calls", "expected_sd", "rmse_to_all_blocks", "pearson_to_all_blocks")


def register(subparsers) -> None:
    sub = add_noun(subparsers, "rubric", "the adaptive rubric: which questions are worth asking")
    p = sub.add_parser(
        "plan",
        help="simulate the adaptive rubric on a features table: calls and quality per budget",
        description="Simulate the adaptive rubric on a features table before paying for calls: for each budget "
        "(calls per text), the blocks it would ask and the expected quality of the main score (its expected "
        "standard deviation, its RMSE and Pearson against the score with every block; with --annotations the "
        "main question's pair NLL and Pearson); a last row applies the stop rule (min_gain). Settings: the "
        "adaptive section of an extract config (--config), flags over it.",
    )
    p.add_argument("features", help="features table with every block of the texts (.csv/.tsv/.parquet/.jsonl)")
    p.add_argument("--calibrator", required=True, help="calibrator checkpoint trained on such features")
    p.add_argument(
        "--annotations", help="human annotations of these texts: adds the main question's pair NLL and Pearson"
    )
    p.add_argument("--out", required=True, help="plan to write (.json)")
    p.add_argument("--config", help="an extract config (conf/extract/*.yaml): its adaptive section")
    p.add_argument("--budgets", type=int, nargs="+", help="budgets to simulate (default: 1 to every block)")
    p.add_argument("--min-gain", dest="min_gain", type=float, help="the stop rule's threshold (adaptive.min_gain)")
    p.add_argument("--budget", type=int, help="the stop rule's budget (adaptive.budget)")
    p.add_argument("--draws", type=int, help="completions per expected reduction (adaptive.draws)")
    p.add_argument("--judges", nargs="+", help="target judges (adaptive.judges; default every judge)")
    p.set_defaults(run=run_plan)


def run_plan(args) -> int:
    from llmrubric.apps.commands import section_settings
    from llmrubric.evaluation.adaptive import plan
    from llmrubric.io.files import write_json
    from llmrubric.io.tables import Tables, read_table, validate_annotations, validate_features
    from llmrubric.model.adaptive import Selector
    from llmrubric.model.core.checkpoints import load_model

    if not str(args.out).endswith(".json"):
        raise InputError("the plan is written as JSON: give --out a .json path", setting="--out")
    for budget in args.budgets or []:
        if budget < 1:
            raise InputError(f"a budget must be at least 1, not {budget}", setting="--budgets")
    settings = section_settings(args, "extract", "adaptive", "min_gain", "budget", "draws", "judges")
    model = load_model(args.calibrator)
    selector = Selector(model, settings)
    features = validate_features(read_table(args.features, "features"), model.rubric)
    annotations = (
        validate_annotations(read_table(args.annotations, "annotations"), model.rubric)
        if args.annotations
        else features.iloc[:0][["text_id"]].assign(judge_id="", question_id="", answer="")
    )
    result = plan(selector, Tables(annotations, features, None), args.budgets)
    result.update({"features": str(args.features), "calibrator": str(args.calibrator), "settings": selector.settings})
    write_json(result, args.out)
    columns = [*COLUMNS, *(["pair_nll", "pair_pearson"] if args.annotations else [])]
    print("\t".join(columns))
    for row in result["rows"]:
        print("\t".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in columns))
    print(f"{result['texts']} texts → {args.out}")
    return 0
