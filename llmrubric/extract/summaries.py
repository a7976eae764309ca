"""Fixed-size summaries of variable-size test banks, as features blocks per text.

Per-item blocks (question id ``<family>:<item_id>``) are first normalised over their
options (each item's distribution sums to 1), then summarised per text:

- ``<family>.mean``: mean distribution over the text's items (options: the family's);
- ``<family>.max``: distribution of the highest grade over items, items independent:
  ``P(max <= g) = prod_i P_i(grade <= g)``;
- ``<family>.cov_ge<g>`` (option ``covered``): expected fraction of items graded >= g;
- for ``nugget_support``: ``.vital_support`` / ``.all_support`` (option ``support``):
  expected fraction of vital / all nuggets graded ``support`` (absent if the text has no
  vital nuggets — a masked block, never a 0).

Items whose block is missing (failed, incomplete) are left out of the summary.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Options in increasing grade order, per family.
ORDER = {
    "self_rating": ("0", "1", "2", "3", "4", "5"),
    "answer_quality": ("1", "2", "3", "4", "5"),
    "nugget_support": ("not_support", "partial_support", "support"),
}


def summarise(features: pd.DataFrame, family: str, importance: dict[str, str] | None = None) -> pd.DataFrame:
    """Summary blocks for the ``family`` items in ``features``; ``importance``: item id → vital/okay."""
    order = ORDER[family]
    prefix = f"{family}:"
    items = features[features.question_id.str.startswith(prefix)]
    if items.empty:
        return pd.DataFrame(columns=["text_id", "source", "question_id", "option", "prob"])
    wide = items.pivot_table(
        index=["text_id", "source", "question_id"], columns="option", values="prob", aggfunc="first"
    )
    wide = wide.reindex(columns=list(order))
    p = wide.to_numpy(dtype=float)
    p = p / p.sum(axis=1, keepdims=True)  # (items, options), each row sums to 1
    rows = []
    frame = pd.DataFrame(p, index=wide.index, columns=list(order))
    for (text_id, source), block in frame.groupby(level=["text_id", "source"], sort=True):
        dist = block.to_numpy()
        add = lambda qid, option, prob: rows.append((text_id, source, f"{family}.{qid}", option, float(prob)))
        for option, prob in zip(order, dist.mean(axis=0)):
            add("mean", option, prob)
        max_cdf = np.prod(np.cumsum(dist, axis=1), axis=0)
        for option, prob in zip(order, np.diff(np.concatenate([[0.0], max_cdf]))):
            add("max", option, max(prob, 0.0))
        for g in range(1, len(order)):
            add(f"cov_ge{order[g]}", "covered", (1.0 - np.cumsum(dist, axis=1)[:, g - 1]).mean())
        if family == "nugget_support":
            support = dist[:, order.index("support")]
            add("all_support", "support", support.mean())
            if importance is not None:
                ids = [q[len(prefix) :] for q in block.index.get_level_values("question_id")]
                vital = np.array([importance.get(i) == "vital" for i in ids])
                if vital.any():
                    add("vital_support", "support", support[vital].mean())
    return pd.DataFrame(rows, columns=["text_id", "source", "question_id", "option", "prob"])
