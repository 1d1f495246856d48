"""Every docstring example in the package runs and shows what it claims."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest
import torch

import p2p_compress

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(p2p_compress.__path__, prefix="p2p_compress.")
)


@pytest.mark.parametrize("name", ["p2p_compress", *MODULES])
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    globs = {n: getattr(p2p_compress, n) for n in p2p_compress.__all__}
    globs["torch"] = torch
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
