"""Frames: the binary form of one send and the classification of its payload."""
