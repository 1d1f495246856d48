"""User extension modules a worker process imports before its ``__init__`` runs.

RLinf lets a job register custom environments, models and the like in every worker
without patching: ``$RLINF_EXT_MODULE`` names a module, and each worker process imports
it and calls its ``register()``. p2p reads the same variable, and ``$P2P_EXT_MODULE``.
"""

from __future__ import annotations

import importlib
import logging
import os

from p2p_worker._errors import WorkerError

EXT_MODULE_ENVS = ("P2P_EXT_MODULE", "RLINF_EXT_MODULE")
"""Environment variables naming an extension module (each holds one module name)."""

_log = logging.getLogger("p2p_worker.extensions")


def load_user_extensions() -> list[str]:
    """Import each module named in :data:`EXT_MODULE_ENVS` and call its ``register()``.

    A module without ``register()`` is imported only (a warning is logged). A module
    named in both variables is loaded once.

    Returns:
        The module names loaded, in order (empty when neither variable is set).

    Raises:
        WorkerError: A module cannot be imported, or its ``register()`` raised (the
            original error is the cause). RLinf logs these and goes on; p2p stops the
            worker's start, so a launch with a broken extension fails at once.

    Example:
        >>> os.environ.pop("P2P_EXT_MODULE", None); os.environ.pop("RLINF_EXT_MODULE", None)
        >>> load_user_extensions()
        []
    """
    names: list[str] = []
    for var in EXT_MODULE_ENVS:
        name = os.environ.get(var, "").strip()
        if name and name not in names:
            names.append(name)
    for name in names:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            raise WorkerError(
                f"extension module {name!r} (from ${_var_of(name)}) cannot be imported: {exc}"
            ) from exc
        register = getattr(module, "register", None)
        if register is None:
            _log.warning("extension module %r has no register() function", name)
            continue
        try:
            register()
        except Exception as exc:
            raise WorkerError(f"extension module {name!r}: register() failed: {exc}") from exc
    return names


def _var_of(name: str) -> str:
    return next(v for v in EXT_MODULE_ENVS if os.environ.get(v, "").strip() == name)
