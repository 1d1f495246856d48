"""Peers: one remote process each, its identity checks at rendezvous and its fate."""
