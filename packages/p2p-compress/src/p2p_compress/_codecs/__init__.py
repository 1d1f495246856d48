"""Codecs: the codec interface, lz4, zstd and sparse on tensor memory, and library probes."""
