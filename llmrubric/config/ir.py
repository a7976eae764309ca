"""IR evaluation settings (``conf/ir/``: ``llmrubric ir``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
class ImportsConfig:
    """Reading the IR ecosystem's files (``imports.*``: ``llmrubric import``, ``llmrubric ir qrels --annotations``).

    Attributes:
        judge_id: the judge of the human labels (qrels, the workbench's ``judgments``).
        question_id: the rubric question they answer (``conf/rubric/relevance.yaml``'s ``relevance``).
        nuggetizer_source: the features source of the AutoNuggetizer's assignments.
        format: the tables' file format (``parquet``, ``csv``, ``tsv`` or ``jsonl``).
    """

    judge_id: str = "assessor"
    question_id: str = "relevance"
    nuggetizer_source: str = "nuggetizer"
    format: str = "parquet"


@dataclass
class IRConfig:
    """IR evaluations (:mod:`llmrubric.ir`; ``conf/ir/``, ``--config``). ``grounded_qa``: ``family``,
    ``lambda`` (combined = lambda × answer + (1 - lambda) × evidence; a Python keyword, hence a mapping)
    and ``recall_at``."""

    autograder: AutograderConfig = field(default_factory=AutograderConfig)
    nuggets: NuggetsConfig = field(default_factory=NuggetsConfig)
    imports: ImportsConfig = field(default_factory=ImportsConfig)
    grounded_qa: dict[str, Any] = field(
        default_factory=lambda: {"family": "answer_quality", "lambda": 0.5, "recall_at": [1, 5]}
    )
