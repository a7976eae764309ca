"""``make test`` runs ``pytest -n 2 --dist loadgroup``: the tests that share an expensive module or session
fixture (SmolLM2 and its llama.cpp server, the fast report) carry ``xdist_group`` so that one worker runs them
all and builds the fixture once. Under some pytest / pytest-xdist pairs the mark is silently ignored and each
worker builds the fixture itself (pytest 9.2 with pytest-xdist 3.8: pytest-xdist#1386, hence ``pytest<9.2`` in
``pyproject.toml``); this test fails then."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("probe")


def test_a_grouped_test_is_scheduled_with_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest -n N --dist loadgroup (make test)")
    assert request.node.nodeid.endswith("@probe"), (
        f"{request.node.nodeid}: xdist_group marks are ignored by this pytest-xdist and pytest; every worker "
        "builds the grouped fixtures itself (pytest-xdist#1386)"
    )
