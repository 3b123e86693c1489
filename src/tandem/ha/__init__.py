"""High availability: node manager lock file, activations (shared store, replication)."""
