"""p2p-collective."""

__all__: list[str] = []
