"""p2p-worker."""

__all__: list[str] = []
