"""Codecs: the interface, lz4, zstd, sparse and the byte shuffle on tensor memory; probes."""
