"""Controller: hot-key decisions, replica weights, replication and coherence, independent of the switch."""
