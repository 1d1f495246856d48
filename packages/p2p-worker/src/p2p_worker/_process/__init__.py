"""What every worker process is, below groups and channels.

WorkerBase, its Ray actor, timers, worker-level collectives, per-pair options, accelerator
facts and extension modules.
"""
