"""What p2p-worker builds on beyond the user-facing names of p2p_collective.

Stable within one release of the p2p stack (the packages are released together), but not
part of the user-facing API that ``p2p_collective.__all__`` lists.
"""

from p2p_collective._groups._multi_ops import check_reducible

__all__ = ["check_reducible"]
