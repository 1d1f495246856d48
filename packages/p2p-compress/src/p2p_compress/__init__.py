"""p2p-compress."""

__all__: list[str] = []
