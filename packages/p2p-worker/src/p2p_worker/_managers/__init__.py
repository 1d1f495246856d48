"""RLinf's job-wide managers: named singleton actors reached through a proxy."""
