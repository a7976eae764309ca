"""Rank intervals on the leaderboard: the construction from intervals, max-t over the replicates, Bonferroni
under a system level, shift errors or human labels, the files, and joint coverage of known true ranks."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from llmrubric.io.rubric import Rubric
from llmrubric.scoring import leaderboard as lb
from llmrubric.scoring.leaderboard.board import LeaderboardResult
from llmrubric.scoring.ranks import rank_intervals

VALUES = np.array([0.0, 1.0])


def system(name: str, scores) -> lb.SystemData:
    """A system of one judge whose text scores are ``scores`` (expected answers on options 0 and 1)."""
    x = np.asarray(scores, float)
    ids = np.array([f"{name}-{i}" for i in range(len(x))], dtype=object)
    return lb.SystemData(name, ids, None, np.stack([1 - x, x], axis=1)[:, None, :], VALUES)


def test_rank_intervals_count_the_systems_surely_above_and_surely_below():
    low, high = rank_intervals([0.8, 0.4, 0.45, 0.1, np.nan], [0.9, 0.5, 0.55, 0.2, np.nan])
    assert low.tolist() == [1, 2, 2, 4, 1] and high.tolist() == [2, 4, 4, 5, 5]  # the NaN one may be anywhere


def test_two_systems_far_apart_and_two_that_overlap_get_exact_rank_intervals():
    """B and C are 4.5 replicate sds apart: their per-system 95 % intervals are disjoint, the max-t ones over 4
    systems (c ≈ 2.49) overlap, so both can hold ranks 2 and 3."""
    noise = np.random.default_rng(0).normal(0, 1, (4, 4000))
    centres = {"A": 0.9, "B": 0.59, "C": 0.5, "D": 0.1}
    systems = [system(s, [c - 0.01, c + 0.01]) for s, c in centres.items()]
    boot = {"means": {s: c + 0.02 * noise[i] for i, (s, c) in enumerate(centres.items())}}
    board = lb.leaderboard(systems, boot).set_index("system")
    assert board["rank"].to_dict() == {"A": 1, "B": 2, "C": 3, "D": 4}
    assert board.rank_low.to_dict() == {"A": 1, "B": 2, "C": 2, "D": 4}
    assert board.rank_high.to_dict() == {"A": 1, "B": 3, "C": 3, "D": 4}
    per_system = rank_intervals(board.low, board.high)
    assert per_system[0].tolist() == per_system[1].tolist() == [1, 2, 3, 4]
    assert list(lb.leaderboard(systems, boot).columns) == [
        "rank",
        "system",
        "score",
        "low",
        "high",
        "rank_low",
        "rank_high",
        "texts",
    ]


def test_max_t_intervals_take_the_quantile_of_the_largest_standardised_deviation():
    m = np.array([[1.0, -1.0, 1.0, -1.0], [2.0, 0.0, 0.0, -2.0]])
    low, high = lb.simultaneous_intervals(m, np.zeros(2), alpha=0.5)
    sd = m.std(axis=1, ddof=1)
    c = np.quantile(np.max(np.abs(m) / sd[:, None], axis=0), 0.5)
    assert np.allclose(high, c * sd) and np.allclose(low, -c * sd)
    flat = lb.simultaneous_intervals(np.array([[3.0, 3.0, 3.0], [0.0, 1.0, np.nan]]), np.array([3.0, 0.5]))
    assert flat[0][0] == flat[1][0] == 3.0 and flat[0][1] < 0.5 < flat[1][1]  # sd 0: the point; NaN ignored
    rng = np.random.default_rng(1)
    many = rng.normal(0, 1, (8, 4000))
    joint_low, joint_high = lb.simultaneous_intervals(many, np.zeros(8))
    inside = ((many >= joint_low[:, None]) & (many <= joint_high[:, None])).all(axis=0).mean()
    assert inside == pytest.approx(0.95, abs=0.002) and (joint_high > stats.norm.ppf(0.975)).all()


def test_a_system_level_ranks_by_bonferroni_level_intervals_and_shift_errors_add_shift_ranks():
    question = Rubric.from_dict({"name": "t", "questions": [{"id": "Q", "main": True, "options": [1, 2, 3, 4]}]}).main
    dist = {"A": [0, 0, 0.5, 0.5], "B": [0, 0.5, 0.5, 0], "C": [0.5, 0.5, 0, 0]}
    rows = [
        (f"{s}{i}", "j", s, "Q", *(1 - i / 10) * np.array(dist[s]) + [0, 0, 0, i / 10]) for s in "ABC" for i in range(3)
    ]
    predictions = pd.DataFrame(
        rows, columns=["text_id", "judge_id", "system_id", "question_id", "p_1", "p_2", "p_3", "p_4"]
    )
    levels = pd.DataFrame(
        {"level": [3.0, 2.9, 1.0], "level_sd": [0.2, 0.2, 0.05], "sigma_within": 0.5, "known": True},
        index=pd.Index(["A", "B", "C"], name="system"),
    ).assign(level_df=math.inf)
    errors = pd.Series([0.1, -0.2, 0.05])
    res = lb.build(predictions, question, n_boot=50, levels=levels, shift_errors=errors)
    board = res.board.set_index("system")
    z = stats.norm.ppf(1 - 0.05 / 6)  # Bonferroni over 3 systems
    expected = rank_intervals(levels.level - z * levels.level_sd, levels.level + z * levels.level_sd)
    assert board.rank_low.reindex(levels.index).tolist() == expected[0].tolist() == [1, 1, 3]
    assert board.rank_high.reindex(levels.index).tolist() == expected[1].tolist() == [2, 2, 3]
    half = lb.shift_half_width(errors, 0.05 / 3)
    shift = rank_intervals(board.score - half, board.score + half)
    assert board.shift_rank_low.tolist() == shift[0].tolist() and board.shift_rank_high.tolist() == shift[1].tolist()
    assert res.settings["rank_intervals"]["rank"].startswith("Bonferroni") and res.settings["rank_intervals"][
        "shift_rank"
    ].startswith("Bonferroni")


def labelled_systems():
    """A, B, C, D: 20 texts each around 0.9, 0.5, 0.555, 0.2; labels (text score + deterministic noise) on the first
    10 texts of A, B and C, none of D."""
    offsets = np.linspace(-0.05, 0.05, 20)
    centres = {"A": 0.9, "B": 0.5, "C": 0.555, "D": 0.2}
    systems = [system(s, c + offsets) for s, c in centres.items()]
    noise = np.tile([0.03, -0.03], 5)
    labels = pd.concat(
        [pd.Series(s.text_scores()[:10] + noise, index=s.text_ids[:10]) for s in systems if s.system != "D"]
    )
    return systems, labels


def test_label_ranks_are_the_rank_intervals_of_the_bonferroni_ppi_pp_intervals():
    """A far above; B and C apart at 95 % one at a time, overlapping at 1 − 0.05 / 4; D unlabelled (no interval:
    any rank, and surely above or below no one)."""
    from llmrubric.scoring import labels as lab

    systems, labels = labelled_systems()
    out = lb.label_rank_intervals(systems, labels, alpha=0.05).set_index("system")
    assert out.label_rank_low.to_dict() == {"A": 1, "B": 2, "C": 2, "D": 1}
    assert out.label_rank_high.to_dict() == {"A": 2, "B": 4, "C": 4, "D": 4}
    intervals = []
    for s in systems:
        has = np.isin(s.text_ids, labels.index)
        f = s.text_scores()
        intervals.append(lab.uniform_interval("ppi_pp", labels.reindex(s.text_ids[has]), f[has], f[~has], 0.05 / 4))
    expected = rank_intervals([i["low"] for i in intervals], [i["high"] for i in intervals])
    assert out.label_rank_low.tolist() == expected[0].tolist() and out.label_rank_high.tolist() == expected[1].tolist()
    one_at_a_time = lb.label_intervals(systems, labels, alpha=0.05).set_index("system")
    assert one_at_a_time.at["C", "ppi_pp_low"] > one_at_a_time.at["B", "ppi_pp_high"]  # not joint: C surely above B
    d_labelled = pd.concat([labels, pd.Series([0.2, 0.21, 0.19], index=systems[3].text_ids[:3])])
    full = lb.label_rank_intervals(systems, d_labelled).set_index("system")
    assert full.label_rank_low.tolist() == [1, 2, 2, 4] and full.label_rank_high.tolist() == [1, 3, 3, 4]


def test_a_board_with_labels_has_label_ranks_that_hold_each_systems_rank_by_ppi_pp(tmp_path):
    question = Rubric.from_dict({"name": "t", "questions": [{"id": "Q", "main": True, "options": [0, 1]}]}).main
    systems, labels = labelled_systems()
    rows = [(t, "j", s.system, "Q", *s.probs[i, 0]) for s in systems for i, t in enumerate(s.text_ids)]
    predictions = pd.DataFrame(rows, columns=["text_id", "judge_id", "system_id", "question_id", "p_0", "p_1"])
    res = lb.build(predictions, question, n_boot=50, labels=labels)
    board = res.board.set_index("system")
    assert board.label_rank_low.to_dict() == {"A": 1, "B": 2, "C": 2, "D": 1}
    assert board.label_rank_high.to_dict() == {"A": 2, "B": 4, "C": 4, "D": 4}
    labelled = board.dropna(subset=["ppi_pp"])
    by_ppi = len(labelled) + 1 - stats.rankdata(labelled.ppi_pp)
    assert ((labelled.label_rank_low <= by_ppi) & (by_ppi <= labelled.label_rank_high)).all()
    assert res.settings["rank_intervals"]["label_rank"].startswith("Bonferroni: the PPI++ intervals")
    text = lb.markdown(res.board, "Q", res.settings)
    assert "| PPI++ [interval] | label ranks |" in text
    assert "| 10 | " in text and " | 2–4 |" in text and "| D |" in text
    assert "label ranks: the same for the human means, from the k labelled texts (Bonferroni" in text
    assert "label_rank_low" not in lb.build(predictions, question, n_boot=50).board.columns


@pytest.mark.slow
def test_the_files_show_the_rank_interval(tmp_path):
    systems = [system("A", [0.9, 0.92, 0.88]), system("B", [0.5, 0.6, 0.4]), system("C", [0.45, 0.55, 0.5])]
    boot = lb.bootstrap(systems, 200, 0, sample_answers=False, keep_text_scores=20)
    board = lb.leaderboard(systems, boot)
    settings = {"question": "Q", "judges": ["j"], "rank_intervals": {"rank": "max-t", "alpha": 0.05, "systems": 3}}
    paths = lb.write(LeaderboardResult(board, pd.DataFrame(), boot, systems, settings), tmp_path)
    text = paths["md"].read_text()
    assert "| rank | system | score | 95% interval | ranks | texts |" in text
    assert "| 1 | A | 0.900 |" in text and " | 1 | 3 |" in text and " | 2–3 | 3 |" in text
    assert "all 3 jointly at 95 % (max-t)" in text
    assert pd.read_csv(paths["csv"]).rank_high.tolist() == [1, 3, 3]
    assert paths["plot"].read_bytes()[:4] == b"\x89PNG"


K, TEXTS, REPLICATES, SEEDS, ALPHA = 8, 40, 400, 200, 0.05
MEANS = np.array([0.30, 0.40, 0.48, 0.50, 0.501, 0.502, 0.52, 0.60])  # a near-tied middle, distinct true ranks
TRUE_RANKS = K - stats.rankdata(MEANS).astype(int) + 1


def _covered(low, high, truth) -> bool:
    return bool(((np.asarray(low) <= truth) & (truth <= np.asarray(high))).all())


@pytest.mark.slow
def test_rank_intervals_cover_the_true_ranks_jointly_where_per_system_intervals_do_not():
    """200 boards of 8 systems with known means (text scores Beta around them, 40 texts): the rank intervals hold
    all true ranks in at least 1 − α − 0.02 of them; the per-system percentile intervals hold all 8 means in far
    fewer (the max-t ones: close to 1 − α, the bootstrap's own small-sample shortfall aside), and per-system
    percentile intervals of the replicates' ranks miss a true rank often."""
    found = {"ranks": [], "means_max_t": [], "means_per_system": [], "ranks_per_system": []}
    widths = []
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        systems = [system(f"s{k}", rng.beta(10 * m, 10 * (1 - m), TEXTS)) for k, m in enumerate(MEANS)]
        boot = lb.bootstrap(systems, REPLICATES, seed, sample_answers=False)
        board = lb.leaderboard(systems, boot, ALPHA).set_index("system").loc[[s.system for s in systems]]
        found["ranks"].append(_covered(board.rank_low, board.rank_high, TRUE_RANKS))
        widths.append((board.rank_high - board.rank_low).mean())
        replicates = np.stack([boot["means"][s.system] for s in systems])
        found["means_max_t"].append(_covered(*lb.simultaneous_intervals(replicates, board.score, ALPHA), MEANS))
        found["means_per_system"].append(_covered(board.low, board.high, MEANS))
        ranks = K - stats.rankdata(replicates, axis=0) + 1
        per_system = np.quantile(ranks, [ALPHA / 2, 1 - ALPHA / 2], axis=1)
        found["ranks_per_system"].append(_covered(*per_system, TRUE_RANKS))
    coverage = {k: float(np.mean(v)) for k, v in found.items()}
    assert coverage["ranks"] >= 1 - ALPHA - 0.02, coverage
    assert 1 < np.mean(widths) < K - 1  # informative: neither every rank nor a point
    assert coverage["means_max_t"] >= 1 - ALPHA - 0.1 and coverage["means_per_system"] <= 0.75, coverage
    assert coverage["ranks_per_system"] <= 1 - ALPHA - 0.05, coverage
