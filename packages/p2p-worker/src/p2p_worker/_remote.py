"""How p2p-worker types the methods of a Ray actor handle.

Ray looks an actor handle's methods up by name, so a type checker cannot see them. Each
place that calls an actor describes its handle as a Protocol whose attributes are
methods (:class:`RemoteMethod`): what ``.remote(...)`` takes, and the result its ``ObjectRef``
holds. The handles Ray hands out are cast to those Protocols where they enter.
"""

from __future__ import annotations

from typing import Generic, ParamSpec, Protocol, TypeVar

import ray

P = ParamSpec("P")
R = TypeVar("R")


class RemoteMethod(Protocol, Generic[P, R]):
    """A method of a Ray actor handle: ``handle.method.remote(...)`` -> an ``ObjectRef``.

    ``RemoteMethod[[int, str], bool]`` takes an int and a str and returns a ref to a bool;
    ``RemoteMethod[..., R]`` leaves the arguments unchecked.
    """

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ray.ObjectRef[R]:
        """Call the method on the actor; the reference of its return value."""
        ...

    def options(self, **options: object) -> RemoteMethod[P, R]:
        """The same method with Ray call options (``num_returns``, ``name``, ...)."""
        ...
