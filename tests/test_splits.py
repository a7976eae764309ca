import pytest
from omegaconf import OmegaConf

from llmrubric.config import compose
from llmrubric.data.splits import holdout_texts, system_folds, system_group_folds, system_groupings, text_folds
from llmrubric.experiments.experiment import check_settings, make_folds, splits_from_folds
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables


def test_folds_partition_texts_evenly_and_deterministically():
    texts = [f"t{i}" for i in range(23)] * 3
    folds = text_folds(texts, 5, seed=1)
    assert sorted(folds.text_id) == sorted(set(texts))
    assert folds.fold.value_counts().max() - folds.fold.value_counts().min() <= 1
    assert folds.equals(text_folds(texts, 5, seed=1))
    assert not folds.equals(text_folds(texts, 5, seed=2))


def test_holdout_is_disjoint():
    kept, held = holdout_texts([f"t{i}" for i in range(10)], 0.3, seed=0)
    assert len(held) == 3 and not set(kept) & set(held) and len(kept) + len(held) == 10
    with pytest.raises(InputError):
        text_folds(["a"], 5, 0)


def test_system_folds_leave_one_system_out(simulated):
    folds = system_folds(simulated)
    assert sorted(folds.text_id) == simulated.text_ids
    systems = simulated.texts.set_index("text_id").system_id
    assert folds.groupby("fold").system_id.nunique().eq(1).all()
    assert (folds.set_index("text_id").system_id == systems.reindex(folds.text_id)).all()
    assert folds.fold.nunique() == systems.nunique()


def test_systems_protocol_tests_each_model_on_a_system_it_never_saw(simulated):
    cfg = OmegaConf.create({"protocol": "systems", "seed": 0})
    splits = splits_from_folds(cfg, make_folds(cfg, simulated), simulated, None)
    system = simulated.texts.set_index("text_id").system_id
    tested = [set(system[split.test.text_ids]) for split in splits]
    assert all(len(s) == 1 for s in tested) and len(set.union(*tested)) == len(splits) == system.nunique()
    for split, s in zip(splits, tested):
        assert not set(system[split.train.text_ids]) & s


def test_system_folds_name_the_missing_system_ids(simulated):
    no_system = Tables(
        simulated.annotations.drop(columns="system_id"), simulated.features, simulated.texts.drop(columns="system_id")
    )
    with pytest.raises(InputError, match="system_id"):
        system_folds(no_system)
    one = simulated.subset(simulated.texts.text_id[simulated.texts.system_id == simulated.texts.system_id.iloc[0]])
    with pytest.raises(InputError, match="at least 2 systems"):
        system_folds(one)


def test_the_leave_one_system_out_experiment_tests_each_synthetic_system_alone(llm_rubric_data):
    synthetic, _ = llm_rubric_data
    cfg = compose("config", ["experiment=llm_rubric_systems"])
    splits = splits_from_folds(cfg, make_folds(cfg, synthetic), synthetic, None)
    held = [sorted({t.split("_")[0] for t in split.test.text_ids}) for split in splits]
    assert cfg.protocol == "systems" and held == [["V1"], ["V2"], ["V3"], ["V4"], ["V5"]]
    assert sum(len(split.test.annotations) for split in splits) == len(synthetic.annotations)


def test_system_folds_name_a_system_without_annotations(simulated):
    texts = simulated.texts.copy()
    texts.loc[texts.index[0], "system_id"] = "S9"  # a system whose only text is ...
    annotated = Tables(
        simulated.annotations[simulated.annotations.text_id != texts.text_id.iloc[0]], simulated.features, texts
    )
    with pytest.raises(InputError, match="S9") as e:
        system_folds(annotated)  # ... not annotated
    assert "no annotated text" in str(e.value) and "system_id" in str(e.value)


def test_system_group_folds_deal_whole_systems_into_k_seeded_groups(simulated):
    folds = system_group_folds(simulated, 3, seed=0)
    systems = simulated.texts.set_index("text_id").system_id
    assert sorted(folds.text_id) == simulated.text_ids
    assert (folds.set_index("text_id").system_id == systems.reindex(folds.text_id)).all()
    assert folds.groupby("system_id").fold.nunique().eq(1).all()  # every text of a system in one group
    per_group = folds.drop_duplicates("system_id").fold.value_counts()
    assert sorted(per_group.index) == [0, 1, 2] and per_group.sum() == systems.nunique() == 4
    assert per_group.max() - per_group.min() <= 1
    assert folds.equals(system_group_folds(simulated, 3, seed=0))
    deals = {tuple(system_group_folds(simulated, 2, seed=s).drop_duplicates("system_id").fold) for s in range(8)}
    assert len(deals) > 1  # the seed changes which systems share a group


@pytest.mark.parametrize("k", [1, 0, 5])
def test_system_groups_outside_2_to_the_number_of_systems_is_an_error_naming_the_setting(simulated, k):
    with pytest.raises(InputError, match=f"setting system_groups: {k} groups of 4 systems"):
        system_group_folds(simulated, k, seed=0)


@pytest.mark.slow
def test_check_settings_refuses_fewer_than_2_system_groups(tmp_path):
    cfg = compose("config", ["experiment=demo", "protocol=system_groups", "system_groups=1", f"run_dir={tmp_path}"])
    with pytest.raises(InputError, match="setting system_groups"):
        check_settings(cfg)
    check_settings(compose("config", ["experiment=demo", "protocol=system_groups", f"run_dir={tmp_path}"]))


@pytest.mark.slow
def test_the_system_groups_experiment_scores_each_group_of_synthetic_systems_with_one_model(llm_rubric_data):
    synthetic, _ = llm_rubric_data
    cfg = compose("config", ["experiment=llm_rubric_system_groups"])
    splits = splits_from_folds(cfg, make_folds(cfg, synthetic), synthetic, None)
    assert sorted({s.grouping for s in splits}) == list(range(cfg.grouping_seeds))
    splits = [s for s in splits if s.grouping == 0]
    held = [{t.split("_")[0] for t in split.test.text_ids} for split in splits]
    trained = [{t.split("_")[0] for t in split.train.text_ids} for split in splits]
    assert cfg.protocol == "system_groups" and sorted(len(h) for h in held) == [2, 3]
    assert set.union(*held) == {f"V{i}" for i in range(1, 6)} and all(not h & t for h, t in zip(held, trained))


@pytest.mark.slow
def test_system_groupings_deal_the_systems_once_per_seed_and_name_every_split(simulated, tmp_path):
    folds = system_groupings(simulated, 2, seed=3, seeds=3)
    assert sorted(folds.grouping.unique()) == [0, 1, 2]
    for g in range(3):
        part = folds[folds.grouping == g].drop(columns="grouping").reset_index(drop=True)
        assert part.equals(system_group_folds(simulated, 2, seed=3 + g))
    cfg = OmegaConf.create({"protocol": "system_groups", "seed": 3, "system_groups": 2, "grouping_seeds": 3})
    splits = splits_from_folds(cfg, make_folds(cfg, simulated), simulated, None)
    assert [(s.name, s.grouping) for s in splits] == [
        ("fold0", 0),
        ("fold1", 0),
        ("grouping1_fold0", 1),
        ("grouping1_fold1", 1),
        ("grouping2_fold0", 2),
        ("grouping2_fold1", 2),
    ]
    for g in range(3):  # each grouping's splits hold every text out once
        held = [t for s in splits if s.grouping == g for t in s.test.text_ids]
        assert sorted(held) == simulated.text_ids
    with pytest.raises(InputError, match="setting grouping_seeds"):
        system_groupings(simulated, 2, seed=0, seeds=0)
    bad = compose("config", ["experiment=demo", "protocol=system_groups", "grouping_seeds=0", f"run_dir={tmp_path}"])
    with pytest.raises(InputError, match="setting grouping_seeds"):
        check_settings(bad)
