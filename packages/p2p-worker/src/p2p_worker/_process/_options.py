"""CollectiveGroupOptions: RLinf's per-pair communication options, accepted and checked.

RLinf passes ``options=CollectiveGroupOptions(...)`` to ``send`` / ``recv`` /
``send_tensor`` / ``recv_tensor`` / ``broadcast``; the options take effect when two
workers first communicate and are ignored afterwards. Every field tunes accelerator
(NCCL-like) communication only; CPU payloads travel on gloo, which has no such knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


def _check_ctas(value: object, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"CollectiveGroupOptions.{name} must be an int or None, got {value!r}")
    if value < 1:
        raise ValueError(f"CollectiveGroupOptions.{name} must be >= 1 or None, got {value}")


@dataclass
class CollectiveGroupOptions:
    """Options for the communication between two workers (RLinf's names and defaults).

    All fields matter on accelerators only; a CPU-only pair accepts and ignores them.
    They are checked when the object is created. Like RLinf, the options of the first
    operation between two workers are the ones that count; later ones are ignored.
    p2p-collective's accelerator groups do not take NCCL process-group options yet, so
    today the fields are validated and recorded (see
    :meth:`~p2p_worker.Worker.collective_options`) but do not change how NCCL runs.

    Attributes:
        accel_cluster_size: NCCL's ``cluster_size`` (>= 1) or ``None``.
        accel_max_ctas: Most cooperative thread arrays NCCL may use (>= 1) or ``None``;
            fewer leave more of the GPU to computation.
        accel_min_ctas: Fewest such arrays (>= 1, at most ``accel_max_ctas``) or ``None``.
        is_high_priority_stream: Run accelerator transfers on a high-priority stream.

    Raises:
        TypeError: A field has the wrong type.
        ValueError: A count is below 1, or ``accel_min_ctas`` > ``accel_max_ctas``.

    Example:
        >>> CollectiveGroupOptions(accel_max_ctas=2).is_empty_options()
        False
        >>> CollectiveGroupOptions().is_empty_options()
        True
    """

    accel_cluster_size: int | None = None
    accel_max_ctas: int | None = None
    accel_min_ctas: int | None = None
    is_high_priority_stream: bool = False

    def __post_init__(self) -> None:
        for name in ("accel_cluster_size", "accel_max_ctas", "accel_min_ctas"):
            _check_ctas(getattr(self, name), name)
        if not isinstance(self.is_high_priority_stream, bool):
            raise TypeError(
                "CollectiveGroupOptions.is_high_priority_stream must be a bool, got "
                f"{self.is_high_priority_stream!r}"
            )
        lo, hi = self.accel_min_ctas, self.accel_max_ctas
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"CollectiveGroupOptions: accel_min_ctas={lo} exceeds accel_max_ctas={hi}"
            )

    def is_empty_options(self) -> bool:
        """Return True when every field has its default."""
        return self == CollectiveGroupOptions()

    def as_dict(self) -> dict[str, object]:
        """Return the fields as a dict."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def check_options(options: object) -> CollectiveGroupOptions | None:
    """Return ``options`` if it is ``None`` or a :class:`CollectiveGroupOptions`.

    Raises:
        TypeError: ``options`` is anything else.
    """
    if options is None or isinstance(options, CollectiveGroupOptions):
        return options
    raise TypeError(
        f"options must be a CollectiveGroupOptions or None, got {type(options).__name__}"
    )
