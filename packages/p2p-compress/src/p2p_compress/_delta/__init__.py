"""Bit-level weight deltas: patches that turn one version of a tensor into the next."""
