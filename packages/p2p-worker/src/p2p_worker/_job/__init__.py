"""The job's cluster: finding or starting Ray, the Cluster object and the rendezvous store."""
