"""Codecs: the codec interface, lz4, zstd and sparse on tensor memory, the byte shuffle, and
library probes.
"""
