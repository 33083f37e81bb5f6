"""Rollout: inference engines, versioned (partial) trajectories and agent environments."""
