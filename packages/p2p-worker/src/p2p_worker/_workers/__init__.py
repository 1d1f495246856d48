"""Workers: the Worker class a user subclasses (WorkerBase plus groups, channels, weights)."""
