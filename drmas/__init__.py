"""drmas: stable reinforcement learning of multi-agent LLM systems (Dr. MAS) on a streaming actor-learner pipeline."""

__version__ = "0.1.0"
