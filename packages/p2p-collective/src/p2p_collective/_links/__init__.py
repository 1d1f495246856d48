"""Links: one direction of a group over one transport, behind one protocol, and its liveness."""
