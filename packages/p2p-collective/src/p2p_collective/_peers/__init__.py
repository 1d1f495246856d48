"""Peers: one remote process each, its identity checks at rendezvous, its liveness and fate."""
