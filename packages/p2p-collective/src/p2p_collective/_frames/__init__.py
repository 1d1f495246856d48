"""Frames: the binary form of one send, its payload classification and its trip over a link."""
