"""Links: one direction of a group over one transport (gloo, shared memory), behind one protocol."""
