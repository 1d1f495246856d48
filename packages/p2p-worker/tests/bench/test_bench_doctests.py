"""The docstring examples of the bench modules run (they document the pure helpers)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = (
    "_spec",
    "_results",
    "_report",
    "_payloads",
    "_baselines",
    "_p2p",
    "_model",
    "_weights_report",
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"p2p_worker.bench.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
