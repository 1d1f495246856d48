"""Worker groups: launching a group, calling its workers, and the handles of calls."""
