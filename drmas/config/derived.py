"""Facts every process derives from a config alike: which agents train which model, which models get a learner.

The buffer queues, the learners pull, the rollouts send and the launchers start processes by these, so they
are computed once, here, from the settings alone.
"""

from __future__ import annotations

from drmas.config.schema import DrmasConfig


def trained_agents(cfg: DrmasConfig, model_id: str) -> list[str]:
    """Agents whose samples train `model_id`."""
    return [n for n, a in cfg.agents.items() if a.model == model_id and a.trainable]


def trained_models(cfg: DrmasConfig) -> list[str]:
    """Models that get a learner: trainable and trained by at least one agent (in the order of `models`)."""
    return [m for m, mcfg in cfg.models.items() if mcfg.trainable and trained_agents(cfg, m)]


def trained_agent_models(cfg: DrmasConfig) -> dict[str, str]:
    """Agent -> model for every agent whose samples train a model: what the buffer queues and learners pull."""
    return {a: m for m in trained_models(cfg) for a in trained_agents(cfg, m)}
