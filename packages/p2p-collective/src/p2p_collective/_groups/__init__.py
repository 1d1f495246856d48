"""Groups: the per-process Collective, two-member and N-member groups over peers and links."""
