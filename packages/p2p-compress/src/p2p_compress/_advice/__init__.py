"""Advice: the ``p2p-compress`` command, codec measurements on sample tensors, byte sizes."""
