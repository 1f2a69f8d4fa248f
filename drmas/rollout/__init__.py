"""Rollout: running multi-agent episodes on engines and turning them into training samples."""
