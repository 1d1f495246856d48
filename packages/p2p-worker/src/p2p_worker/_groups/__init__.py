"""Worker groups: launching a group, placing its workers, calling them, and the handles of calls."""
