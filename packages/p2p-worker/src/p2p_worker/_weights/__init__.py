"""Weight sync: one source pushes a model's versions to many targets, relayed and verified."""
