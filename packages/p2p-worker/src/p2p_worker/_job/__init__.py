"""The job's cluster: finding or starting Ray, the Cluster object and placement strategies."""
