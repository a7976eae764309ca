"""The public API in ``llmrubric.__all__``: every name resolves, and importing the package stays light."""

import subprocess
import sys

import pytest

import llmrubric


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
