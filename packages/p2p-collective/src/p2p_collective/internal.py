"""What p2p-worker builds on beyond the user-facing names of p2p_collective.

Today: the reducibility check of the ``ray.util.collective`` drop-in, and the
collectives of members on one node over their pair groups' shared memory -- two members
(:class:`PairCollectives`) and a ring of three or more (:class:`RingCollectives`).

Stable within one release of the p2p stack (the packages are released together), but not
part of the user-facing API that ``p2p_collective.__all__`` lists.
"""

from p2p_collective._groups._multi_ops import check_reducible
from p2p_collective._groups._pair_ops import PairCollectives, check_like
from p2p_collective._groups._ring_ops import RingCollectives

__all__ = ["PairCollectives", "RingCollectives", "check_like", "check_reducible"]
