"""The bottom of a worker process: its runtime state, the liveness oracle, the store.

The runtime holds the store client and the one Collective; the rendezvous store is the
TCPStore server the driver owns.
"""
