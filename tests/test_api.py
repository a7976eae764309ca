"""The public API in ``llmrubric.__all__``: every name resolves, importing the package stays light, and every
name that takes a rubric takes a :class:`Rubric` or the path of a rubric YAML (anything else: one line)."""

import inspect
import subprocess
import sys

import pandas as pd
import pytest
from support.paths import ROOT

import llmrubric
from llmrubric.io.errors import InputError


@pytest.mark.parametrize("name", llmrubric.__all__)
def test_public_name_resolves(name):
    assert callable(getattr(llmrubric, name))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        llmrubric.nope  # noqa: B018


def test_import_does_not_load_torch():
    code = "import sys, llmrubric; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


RUBRIC = ROOT / "conf" / "rubric" / "llm_rubric.yaml"
SIMULATED = ROOT / "data" / "simulated"
TAKES_RUBRIC = {  # every public name with a ``rubric`` parameter → what it makes of a rubric, to compare
    "load_tables": lambda rubric: (
        llmrubric.load_tables(SIMULATED / "annotations.csv", SIMULATED / "features.csv", rubric).annotations
    ),
    "AutoCalibrator": lambda rubric: llmrubric.AutoCalibrator(rubric).rubric,
    "NetworkCalibrator": lambda rubric: llmrubric.NetworkCalibrator(rubric).rubric,
    "make_model": lambda rubric: llmrubric.make_model("ridge_judge", rubric).rubric,
    "simulate": lambda rubric: llmrubric.simulate(n_texts=8, n_judges=3, rubric=rubric)[0].annotations,
}


def test_every_public_name_with_a_rubric_parameter_is_checked_here():
    names = {n for n in llmrubric.__all__ if "rubric" in inspect.signature(getattr(llmrubric, n)).parameters}
    assert names == set(TAKES_RUBRIC)


def _same(a, b) -> bool:
    return a.equals(b) if isinstance(a, pd.DataFrame) else a == b


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "load_tables" else n for n in sorted(TAKES_RUBRIC)]
)
def test_a_rubric_or_its_path_gives_the_same(name):
    made = TAKES_RUBRIC[name]
    expected = made(llmrubric.Rubric.load(RUBRIC))
    assert _same(made(str(RUBRIC)), expected) and _same(made(RUBRIC), expected)


@pytest.mark.parametrize("name", sorted(TAKES_RUBRIC))
def test_a_rubric_that_is_neither_is_one_line_naming_what_was_given(name):
    with pytest.raises(
        InputError, match=r"^setting rubric: a rubric is a Rubric or the path of a rubric YAML .*got dict$"
    ):
        TAKES_RUBRIC[name]({"questions": []})
    with pytest.raises(InputError, match="nope.yaml: rubric file not found"):
        TAKES_RUBRIC[name]("nope.yaml")
