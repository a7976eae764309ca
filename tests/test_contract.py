"""The model contract (issue 43): what a family can do is declared once, on its registry entry
(``Capabilities``), nothing outside the registry probes for it or lists family names, and every
declared capability is tested here for every family that declares it (the tests iterate the registry)."""

from __future__ import annotations

import ast
from dataclasses import fields

import numpy as np
import pandas as pd
import pytest
from support.paths import ROOT
from support.settings import FAST

import llmrubric.model  # noqa: F401  (registers every family)
from llmrubric.io.errors import InputError
from llmrubric.io.tables import Tables
from llmrubric.model.core import registry
from llmrubric.model.core.registry import CLASS_CAPABILITIES, Capabilities, capabilities, make, names, with_capability
from llmrubric.model.families.baselines import RidgeJudge

REGISTRY = "llmrubric/model/core/registry.py"
PROBED = {  # the attributes code probed with hasattr/getattr before the capabilities were declared
    "fit_many",
    "fits_questions",
    "same_as",
    "proba_completed",
    "answers_",
    "source_",
    "questions_",
    "supports_add_judge",
    "add_judge",
    "members_",
    "nets_",
    "levels_",
    "base",
    "calibrate",
    "choice",
    "added_judges_",
}
SETTING_VALUES = {  # tuples whose strings are a setting's values that happen to be registered names too
    ("llmrubric/model/auto_settings.py", "FAMILIES"),  # model.family: auto | network
    ("llmrubric/model/families/network/cumulative.py", "HEADS"),  # model.head: softmax | ordinal | combined
}
SMALL = {"ensemble": 1, "auto": {"candidates": ["ridge_judge"], "folds": 2}}  # fast models of every name
NETWORK = "llmrubric.model.families.network"  # a family like the others: reached through the registry only
FAMILIES = "llmrubric/model/families/"


def sources() -> dict[str, ast.Module]:
    return {
        p.relative_to(ROOT).as_posix(): ast.parse(p.read_text()) for p in sorted((ROOT / "llmrubric").rglob("*.py"))
    }


def imports(path: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``, at any depth; ``from a import b`` names ``a`` and ``a.b``,
    a relative import is resolved from ``path``."""
    package = path.removesuffix(".py").split("/")[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def network_imports(path: str, tree: ast.Module) -> list[str]:
    """``path:line module`` of each import statement that reaches the network (the last name it imports)."""
    hits = {
        line: module for line, module in imports(path, tree) if module == NETWORK or module.startswith(f"{NETWORK}.")
    }
    return [f"{path}:{line} {module}" for line, module in sorted(hits.items())]


def probes(path: str, tree: ast.Module) -> list[str]:
    """``path:line hasattr(…, 'name')`` of each ``hasattr``/``getattr`` of a :data:`PROBED` attribute."""
    return [
        f"{path}:{node.lineno} {node.func.id}(…, {node.args[1].value!r})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("hasattr", "getattr")
        and len(node.args) > 1
        and isinstance(node.args[1], ast.Constant)
        and node.args[1].value in PROBED
    ]


def name_lists(path: str, tree: ast.Module) -> list[str]:
    """``path:line [names]`` of each tuple, list or set literal holding two or more registered family names
    (but a :data:`SETTING_VALUES` assignment's)."""
    registered = set(names())
    allowed = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and (path, t.id) in SETTING_VALUES for t in node.targets)
    }
    lists = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and id(node) not in allowed:
            found = [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in registered]
            if len(found) >= 2:
                lists.append(f"{path}:{node.lineno} {found}")
    return lists


def test_no_capability_is_probed_outside_the_registry():
    found = [hit for path, tree in sources().items() if path != REGISTRY for hit in probes(path, tree)]
    assert not found, found


def test_no_list_of_family_names_outside_the_registry():
    found = [hit for path, tree in sources().items() if path != REGISTRY for hit in name_lists(path, tree)]
    assert not found, found


def test_the_probe_and_list_checks_find_a_probe_and_a_list_and_pass_what_is_allowed():
    tree = ast.parse(
        'ok = hasattr(m, "fit_many")\n'
        'x = getattr(m, "fit_many", None)\n'
        'fine = hasattr(m, "predict") or getattr(m, name)\n'
        'names = ("network", "ridge_judge")\n'
        'one = ["network", "not_a_family"]\n'
        'FAMILIES = ("auto", "network")\n'
    )
    assert probes("p.py", tree) == ["p.py:1 hasattr(…, 'fit_many')", "p.py:2 getattr(…, 'fit_many')"]
    assert name_lists("p.py", tree) == ["p.py:4 ['network', 'ridge_judge']", "p.py:6 ['auto', 'network']"]
    assert name_lists("llmrubric/model/auto_settings.py", tree) == [
        "llmrubric/model/auto_settings.py:4 ['network', 'ridge_judge']"
    ]


def test_nothing_outside_the_families_imports_the_network():
    """The network is a family like the others: code above the families reaches it through the registry."""
    scripts = {name: ast.parse((ROOT / name).read_text()) for name in ("train.py", "evaluate.py")}
    found = [
        hit
        for path, tree in {**sources(), **scripts}.items()
        if not path.startswith(FAMILIES)
        for hit in network_imports(path, tree)
    ]
    assert not found, found


def test_the_import_test_finds_every_kind_of_import():
    tree = ast.parse(
        "import llmrubric.model.families.network.net\n"
        "from llmrubric.model.families import network\n"
        "from .families.network.calibrator import NetworkCalibrator\n"
        "from ..model.families import mixed, network\n"
        "from llmrubric.model.families import networks, mixed\n"
        "def f():\n    from llmrubric.model.families.network import calibrator\n"
    )
    found = network_imports("llmrubric/model/judges.py", tree)
    assert [hit.partition(" ")[0] for hit in found] == [f"llmrubric/model/judges.py:{n}" for n in (1, 2, 3, 4, 7)]


def test_capabilities_of_a_name_and_of_a_fitted_model_agree(rubric):
    assert capabilities("expected_llm/some_source") == capabilities("expected_llm")  # a per-source name
    ridge = RidgeJudge(rubric)
    assert {f: getattr(capabilities(ridge), f) for f in CLASS_CAPABILITIES} == {
        f: getattr(capabilities("ridge_context"), f) for f in CLASS_CAPABILITIES
    }
    assert capabilities(ridge).questions and not capabilities(ridge).joint_fit
    assert capabilities(object()) == Capabilities()
    assert with_capability("default_candidate") == ["network", "clmm_own", "clmm_all", "clmm_mean", "ridge_judge"]
    assert set(with_capability("default_candidate")) <= set(names(candidate=True))
    assert with_capability("report_default")[-1] == "llm_rubric" and len(set(with_capability("report_default"))) == 9
    with pytest.raises(ValueError, match="unknown capability"):
        with_capability("flies")


class _NoFitMany:
    FORMAT = "llmrubric-contract_test/1"


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as it is, restored after the test (registrations here do not leak)."""
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))
    monkeypatch.setattr(registry, "_NAMES", None)


@pytest.mark.parametrize(
    "caps, candidate, match",
    [
        (Capabilities(joint_fit=True), False, "lacks: \\['fit_many'\\]"),
        (Capabilities(default_candidate=9), False, "candidate=True"),
        (Capabilities(default_candidate=1), True, "default_candidate=1 is network's"),
    ],
)
def test_registration_checks_the_capabilities(scratch_registry, caps, candidate, match):
    with pytest.raises(ValueError, match=match):
        registry.register(
            "contract_test", lambda r, s: _NoFitMany(), _NoFitMany, candidate=candidate, capabilities=caps
        )


def test_one_class_has_one_set_of_class_capabilities(scratch_registry):
    registry.register(
        "contract_a", lambda r, s: _NoFitMany(), _NoFitMany, capabilities=Capabilities(deterministic=True)
    )
    with pytest.raises(ValueError, match="differ from those under contract_a"):
        registry.register(
            "contract_b", lambda r, s: _NoFitMany(), _NoFitMany, capabilities=Capabilities(questions=True)
        )


def one_name_per_class(flag: str) -> list[str]:
    """The first name of each class declaring ``flag`` (class capabilities are the same under every name)."""
    seen, out = set(), []
    for name in with_capability(flag):
        family = registry.entry(name).family
        if family not in seen:
            seen.add(family)
            out.append(name)
    return out


@pytest.fixture(scope="module")
def small(simulated):
    ids = simulated.text_ids
    return simulated.subset(ids[:50]), simulated.subset(ids[50:70])


def fitted(name: str, rubric, tables: Tables, seed: int = 0):
    return make(name, rubric, SMALL, FAST, seed).fit(tables)


def without_block(tables: Tables, question: str) -> Tables:
    """``tables`` with the block of ``question`` removed from half of its texts."""
    f = tables.features
    gone = f.text_id.isin(tables.text_ids[::2]) & (f.question_id == question)
    return Tables(tables.annotations, f[~gone], tables.texts)


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class("absent_blocks"))
def test_every_absent_blocks_family_marginalises_a_removed_block(rubric, small, name):
    train, test = small
    model = fitted(name, rubric, train)
    partial = without_block(test, rubric.main.id)  # the block every family reads for the main question
    main = rubric.ids.index(rubric.main.id)
    marginal = model.predict_proba(partial)[:, main]
    assert model.answers_ is not None and np.isfinite(marginal).all()
    assert np.allclose(marginal.sum(axis=1), 1.0)
    members = model.members_.values() if capabilities(model).members else [model]
    kept = [m.answers_ for m in members]
    for m in members:
        m.answers_ = None  # the old path: the absent block filled with the training mean
    try:
        filled = model.predict_proba(partial)[:, main]
    finally:
        for m, answers in zip(members, kept):
            m.answers_ = answers
    assert np.abs(marginal - filled).max() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class("joint_fit"))
def test_every_joint_fit_family_fits_many_as_one_by_one(rubric, small, name):
    train, test = small
    halves = [train.subset(train.text_ids[:30]), train.subset(train.text_ids[20:])]
    together = [make(name, rubric, SMALL, FAST, seed) for seed in (0, 1)]
    together[0].fit_many(together, halves)
    alone = [fitted(name, rubric, t, seed) for t, seed in zip(halves, (0, 1))]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a.predict_proba(test), b.predict_proba(test), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class("judge_scoring"))
def test_every_judge_scoring_family_predicts_each_judge_as_predict_proba(rubric, small, name):
    train, test = small
    model = fitted(name, rubric, train)
    judges, texts = list(model.judges_.judges[:3]), test.text_ids[:5]
    fast = model.judge_predictor(judges)(model.layout_.matrix(test.features, texts))
    pairs = pd.DataFrame({"text_id": np.repeat(texts, len(judges)), "judge_id": judges * len(texts)})
    reference = model.predict_proba(test, pairs)
    assert fast.shape[:3] == (len(texts), len(judges), len(rubric.ids))
    np.testing.assert_allclose(fast.reshape(len(pairs), *fast.shape[2:]), reference, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", with_capability("deterministic"))
def test_every_deterministic_name_predicts_the_same_whatever_the_seed(rubric, small, name):
    train, test = small
    first, second = (fitted(name, rubric, train, seed).predict_proba(test) for seed in (0, 7))
    assert np.isfinite(first[:, rubric.ids.index(rubric.main.id)]).all()
    np.testing.assert_array_equal(first, second)


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class("questions"))
def test_every_questions_family_fits_the_questions_it_is_given(rubric, small, name):
    train, test = small
    model = make(name, rubric, SMALL, FAST, 0).fit(train, [rubric.main.id])
    assert model.questions_ == [rubric.main.id]
    probs = model.predict_proba(test)
    predicted = [q for i, q in enumerate(rubric.ids) if np.isfinite(probs[:, i]).all()]
    assert predicted == [rubric.main.id]


@pytest.mark.slow
@pytest.mark.parametrize("name", one_name_per_class("add_judge") + one_name_per_class("member_judge"))
def test_every_judge_adding_family_learns_a_judge_it_never_saw(rubric, small, name):
    """``add_judge`` (through ``llmrubric judges add``) and ``member_judge`` (its own, as a ``model=auto`` member)."""
    from llmrubric.model.judges import add_judge

    train, test = small
    judge = sorted(train.annotations.judge_id.astype(str).unique())[-1]
    mine = train.annotations.judge_id.astype(str) == judge
    model = fitted(name, rubric, Tables(train.annotations[~mine], train.features, train.texts))
    new = add_judge(model, train, judge) if capabilities(name).add_judge else model.add_judge(train, judge)
    assert judge in new.judges_.judges and judge not in model.judges_.judges
    texts = test.text_ids[:5]
    pairs = pd.DataFrame({"text_id": texts, "judge_id": [judge] * len(texts)})
    main = new.predict_proba(test, pairs)[:, rubric.ids.index(rubric.main.id), : len(rubric.main.options)]
    assert np.isfinite(main).all() and np.allclose(main.sum(axis=1), 1.0)


def twins(rubric, tables: Tables) -> dict[str, tuple[str, str]]:
    """``same_as`` of every name declaring ``twins`` on ``tables``, where it names one."""
    found = {name: make(name, rubric, SMALL, FAST, 0).same_as(tables) for name in with_capability("twins")}
    return {name: twin for name, twin in found.items() if twin is not None}


def test_clmm_mean_is_the_twin_of_clmm_own_only_where_each_question_has_one_source(rubric, small):
    one = small[0]  # the simulated data: one LLM source
    two = Tables(one.annotations, pd.concat([one.features, one.features.assign(source="other")]), one.texts)
    assert twins(rubric, one) == {"clmm_mean": ("clmm_own", "every question has at most one LLM source")}
    assert twins(rubric, two) == {}


@pytest.mark.slow
def test_every_declared_twin_is_another_registered_name_that_predicts_the_same(rubric, small):
    train, test = small
    found = twins(rubric, train)
    assert found  # clmm_mean's, on one LLM source
    for name, (twin, why) in found.items():
        assert twin in names() and twin != name and why
        np.testing.assert_allclose(
            fitted(name, rubric, train).predict_proba(test), fitted(twin, rubric, train).predict_proba(test), atol=1e-6
        )


@pytest.mark.parametrize("name", names())
def test_every_name_round_trips_its_params(rubric, name):
    """``get_params`` gives the parameters its entry's settings declare (some of them for a name that builds
    another class: ``llm_rubric``), and ``make(name, params=...)`` of them builds a model of the same class and
    parameters; setting every parameter to its value changes nothing."""
    model = make(name, rubric, SMALL, FAST)
    params = model.get_params()
    declared = registry.param_names(name)
    assert (
        sorted(params) == sorted(declared)
        if type(model) is registry.entry(name).family
        else set(params) <= set(declared)
    )
    again = make(name, rubric, params=params)
    assert type(again) is type(model) and again.get_params() == params
    assert model.set_params(**params) is model and model.get_params() == params


@pytest.mark.parametrize("name", names())
def test_every_name_refuses_an_unknown_param_naming_it(rubric, name):
    model = make(name, rubric, SMALL, FAST)
    with pytest.raises(InputError, match="no_such_setting") as error:
        model.set_params(no_such_setting=1)
    assert error.value.setting == "no_such_setting" and "\n" not in str(error.value)


@pytest.mark.parametrize("name", [n for n in names() if registry.search_space(n)])
def test_every_declared_search_space_names_parameters(name):
    assert set(registry.search_space(name)) <= set(registry.param_names(name))


def test_set_params_changes_and_checks_a_setting(rubric):
    mixed = make("clmm_own", rubric).set_params(rounds=2, inputs="all")
    assert mixed.get_params() == {"inputs": "all", "rounds": 2} and mixed.name == "clmm_all"
    with pytest.raises(InputError, match="rounds"):
        mixed.set_params(rounds=0)
    network = make("network", rubric).set_params(**{"model.h1": 7, "trainer.lr": 0.01, "drop_questions": ["Q1"]})
    assert (network.model["h1"], network.trainer.lr, network.drop_questions) == (7, 0.01, ["Q1"])
    with pytest.raises(InputError, match="model.head"):
        network.set_params(**{"model.head": "ordinal"})  # refused with personalize=input, as by the constructor
    assert network.model["head"] == "softmax"  # and nothing changed
    assert make("network", rubric, params={"oracle": "others"}).pair_features.others


def test_every_flag_is_declared_by_some_name():
    assert [f.name for f in fields(Capabilities) if not with_capability(f.name)] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["network", "auto"])
def test_checkpoints_name_the_family_fitted(rubric, small, name):
    """``model.family``'s two values: the checkpoint (and evaluate.py's ``metrics.json``) says which was fitted."""
    meta, _ = fitted(name, rubric, small[0]).state()
    assert meta["family"] == name and registry.entry(meta["family"]).family.FORMAT == meta["format"]


def test_model_default_is_an_alias_of_model_network_that_warns(monkeypatch, caplog):
    from omegaconf import OmegaConf

    from llmrubric.config import group
    from llmrubric.experiments import experiment

    assert group("model", "network") == group("model", "default")
    monkeypatch.setattr(experiment, "check_settings", lambda config: None)
    for choice, warned in (("default", True), ("network", False)):
        caplog.clear()
        with caplog.at_level("WARNING"):
            experiment.CheckSettings().on_run_start(
                OmegaConf.create({"hydra": {"runtime": {"choices": {"model": choice}}}})
            )
        assert ("alias of model=network" in caplog.text) == warned
