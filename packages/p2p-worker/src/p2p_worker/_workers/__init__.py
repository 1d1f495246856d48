"""Workers: the Worker class, its Ray actor, its runtime, timers and worker-level collectives."""
