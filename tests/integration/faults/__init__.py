"""Helpers of the fault-injection tests: peer processes, stopwatches, resource counts.

``faults.peer`` runs inside spawned processes (a peer serving tasks from a queue, or a
bare rendezvous-store host); ``faults.harness`` is the test side (starting, driving and
killing those processes, timing failures, counting threads, descriptors and RSS).
"""
