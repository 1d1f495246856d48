"""``p2p-bench``: the transfer benchmark and demo of the p2p stack (``p2p-bench --help``).

Run it as the ``p2p-bench`` console command or call :func:`main` with an argument list.
"""

from p2p_worker.bench._cli import main

__all__ = ["main"]
