"""The receiving side's object policy: rebuild pickled objects, or only plain data.

Under ``object_policy: plain`` a frame's object part is read by a restricted unpickler
whose ``find_class`` resolves only an explicit set of harmless globals (``complex``,
``collections.OrderedDict``, ``torch.Size`` and the tensor dtypes our frames carry) plus
the dataclasses the job allowlists; any other global is refused by name before it is
imported or called. Pickle's opcodes for None, bool, int, float, str, bytes, bytearray,
list, tuple, dict, set and frozenset need no global at all, so plain data passes.

Without a global, a pickle cannot call anything: ``REDUCE``, ``NEWOBJ`` and ``BUILD``
only ever act on objects that ``find_class`` handed out. So a refused payload runs no
code in this process.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import io
import pickle
from typing import NoReturn

import torch

from p2p_collective._errors import ObjectRefusedError
from p2p_collective._frames._framing import DTYPE_TO_CODE

PLAIN_TYPES = (
    "None, bool, int, float, complex, str, bytes, bytearray, list, tuple, dict,"
    " OrderedDict, set, frozenset, torch.Size, torch dtypes"
)
"""What ``object_policy: plain`` accepts in an object part, besides allowlisted dataclasses."""


def _safe_globals() -> dict[tuple[str, str], object]:
    table: dict[tuple[str, str], object] = {
        ("builtins", "complex"): complex,
        ("builtins", "set"): set,  # sets of protocols < 4
        ("builtins", "frozenset"): frozenset,
        ("collections", "OrderedDict"): collections.OrderedDict,
        ("torch", "Size"): torch.Size,
    }
    for dtype in DTYPE_TO_CODE:
        module, _, name = str(dtype).rpartition(".")
        table[(module, name)] = dtype
    return table


_SAFE = _safe_globals()


def parse_allowlist_entry(entry: str) -> tuple[str, str]:
    """Split ``"pkg.mod:Class"`` (or ``"pkg.mod:Outer.Inner"``) into module and qualname.

    Raises:
        ValueError: ``entry`` is not of that form (dotted Python identifiers on both sides).
    """
    module, sep, qualname = entry.partition(":") if isinstance(entry, str) else ("", "", "")
    ok = bool(sep) and all(
        part.isidentifier() for side in (module, qualname) for part in side.split(".")
    )
    if not ok:
        raise ValueError(
            f"object_allowlist: got {entry!r}; allowed: 'package.module:ClassName' (a"
            " dataclass, named by its module and qualified name)"
        )
    return module, qualname


class _Refused:
    """Stands in for a refused global while a lenient load runs to its end; does nothing."""

    def __new__(cls, *args: object, **kwargs: object) -> _Refused:
        return object.__new__(cls)

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Refused:
        return _Refused()

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, item: object) -> None:
        """Ignore an appended item."""

    def extend(self, items: object) -> None:
        """Ignore appended items."""


@functools.lru_cache(maxsize=256)
def _resolve_dataclass(module: str, qualname: str) -> type | str:
    """The allowlisted class, or why it cannot be used (a string)."""
    try:
        obj: object = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        return f"it is allowlisted but cannot be imported here ({type(exc).__name__}: {exc})"
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        return "it is allowlisted but is not a dataclass (only dataclasses can be allowlisted)"
    return obj


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` hands out only the safe and allowlisted globals."""

    def __init__(self, data: bytes | memoryview, allowlist: frozenset[str], lenient: bool):
        super().__init__(io.BytesIO(data))
        self._allowlist = allowlist
        self._lenient = lenient
        self.refused: list[str] = []

    def find_class(self, module: str, name: str) -> object:
        found = _SAFE.get((module, name))
        if found is not None:
            return found
        why = "it is not plain data"
        if f"{module}:{name}" in self._allowlist:
            resolved = _resolve_dataclass(module, name)
            if isinstance(resolved, type):
                return resolved
            why = resolved
        label = f"{module}.{name}"
        if self._lenient:
            if label not in self.refused:
                self.refused.append(label)
            return _Refused
        raise ObjectRefusedError(refusal_message([label], why))

    def persistent_load(self, pid: object) -> NoReturn:
        raise ObjectRefusedError(refusal_message(["<persistent id>"], "it is not plain data"))


def refusal_message(labels: list[str], why: str = "it is not plain data") -> str:
    """The message of an ObjectRefusedError for the refused globals ``labels``."""
    names = ", ".join(repr(label) for label in labels)
    return (
        f"object_policy 'plain' refused the global {names}: {why}. Accepted: {PLAIN_TYPES},"
        " tensor containers, and dataclasses listed in object_allowlist ('module:ClassName');"
        " send tensors as a tensor, a list/tuple/dict of tensors or a dataclass, not nested"
        " in other objects"
    )


def load_object(
    data: bytes | memoryview, policy: str, allowlist: tuple[str, ...] | frozenset[str] = ()
) -> object:
    """Unpickle a received object part under ``policy``.

    Args:
        data: The pickled bytes.
        policy: ``"pickle"`` (anything) or ``"plain"`` (plain data and allowlisted
            dataclasses only).
        allowlist: ``"module:qualname"`` entries of dataclasses ``"plain"`` accepts.

    Returns:
        The object.

    Raises:
        ObjectRefusedError: ``"plain"`` met a global it does not accept (named in the
            message); nothing of it was imported or called.
        Exception: Whatever unpickling a malformed payload raises.
    """
    if policy == "pickle":
        return pickle.loads(data)
    return _PlainUnpickler(data, frozenset(allowlist), lenient=False).load()


def load_object_lenient(
    data: bytes | memoryview, policy: str, allowlist: tuple[str, ...] | frozenset[str] = ()
) -> tuple[object, list[str]]:
    """Like :func:`load_object`, but run the whole pickle and report what was refused.

    Refused globals are replaced by inert stand-ins (nothing of them runs), so a caller
    that must read the rest (e.g. the tensor specs that follow in a broadcast) can, and
    raise afterwards.

    Returns:
        The object (with stand-ins) and the refused globals as ``module.qualname``.

    Raises:
        Exception: Whatever unpickling a malformed payload raises.
    """
    if policy == "pickle":
        return pickle.loads(data), []
    unpickler = _PlainUnpickler(data, frozenset(allowlist), lenient=True)
    obj = unpickler.load()
    return obj, unpickler.refused
