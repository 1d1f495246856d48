"""Sphinx configuration of the p2p documentation site.

Build it with ``nox -s docs`` or, from an environment that has the four packages
installed, ``sphinx-build -W --keep-going -b html docs docs/_build/html``.

Intersphinx (links into the Python, torch and Ray documentation) is off by default,
because CI machines reach package registries only and a failed inventory fetch is a
warning that ``-W`` turns into an error. Set ``P2P_DOCS_INTERSPHINX=1`` on a machine with
internet access to turn the links on.
"""

from __future__ import annotations

import importlib
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "_ext"))

project = "p2p"
author = "The p2p authors"
copyright = "The p2p authors"

try:
    release = metadata.version("p2p-asyncwork")
except metadata.PackageNotFoundError:  # building from a checkout without the packages
    release = "0.0.0"
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
    "p2p_reports",  # docs/_ext: the committed benchmark reports on the Performance page
]

root_doc = "index"
source_suffix = {".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext", "README.md", "examples", "performance"]
templates_path: list[str] = []

# -- HTML ---------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"p2p {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}
pygments_style = "sphinx"
pygments_dark_style = "monokai"

# -- autodoc and napoleon -----------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "class"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True

# -- intersphinx ----------------------------------------------------------------------------
# Off unless P2P_DOCS_INTERSPHINX=1: CI has no internet access, and an unreachable
# inventory is a plain (uncategorised) warning that ``-W`` would turn into a failure.
# Without the mapping, references such as :class:`torch.Tensor` render as plain code
# text; they never warn because the build is not ``nitpicky``.
INTERSPHINX = {
    "python": ("https://docs.python.org/3", None),
    "torch": ("https://docs.pytorch.org/docs/stable", None),
    "ray": ("https://docs.ray.io/en/latest", None),
}
intersphinx_mapping = INTERSPHINX if os.environ.get("P2P_DOCS_INTERSPHINX") == "1" else {}
intersphinx_timeout = 15

# -- public names -----------------------------------------------------------------------------
# Objects are defined in private modules (``p2p_asyncwork._work``) and re-exported by their
# package, the only import path users should use. autodoc documents them under the package
# (automodule + ``__all__``); this hook makes the "Bases:" lines name the public path too,
# e.g. ``p2p_asyncwork.AsyncWork`` instead of ``p2p_asyncwork._work.AsyncWork``.
PUBLIC_PACKAGES = ("p2p_asyncwork", "p2p_compress", "p2p_collective", "p2p_worker")


def _public_name(obj: object) -> str | None:
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    package = module.split(".")[0]
    if package not in PUBLIC_PACKAGES or module == package:
        return None
    try:
        public = importlib.import_module(package)
    except ImportError:
        return None
    if name in getattr(public, "__all__", ()) and getattr(public, name, None) is obj:
        return f"{package}.{name}"
    return None


def _public_bases(app: Any, name: str, obj: object, options: Any, bases: list[Any]) -> None:
    for i, base in enumerate(bases):
        public = _public_name(base)
        if public is not None:
            bases[i] = f":py:class:`{public}`"


def setup(app: Any) -> None:
    app.connect("autodoc-process-bases", _public_bases)
