"""Per-agent training scalars computed from the samples of one update, shared by every training loop.

The colocated loop and the asynchronous learner log the same names from the same code, so their
TensorBoard runs can be laid over each other. Only plain `{name: float}` dicts and arrays come out;
`drmas.runtime.metrics` decides where they go.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np

from drmas.core.sample import Sample
from drmas.core.staleness import version_lag
from drmas.algorithms.running_stats import ALL, AgentRewardStats


def _by_agent(samples: Sequence[Sample]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        out[s.agent].append(i)
    return out


def agent_scalars(samples: Sequence[Sample], adv: np.ndarray) -> dict[str, float]:
    """Reward, advantage (mean and mean square: about 1 per agent under agent-wise normalisation; none for an
    agent whose advantages are nan, i.e. untrained), validity share, call count and response length of each agent."""
    out = {}
    for agent, idx in _by_agent(samples).items():
        a = adv[idx]
        out[f"reward/{agent}/mean"] = float(np.mean([samples[i].reward for i in idx]))
        if not np.isnan(a).all():  # nan: an agent no model trains (its calls get no advantage)
            out[f"advantage/{agent}/mean"] = float(a.mean())
            out[f"advantage/{agent}/sq_mean"] = float((a**2).mean())
        out[f"valid/{agent}"] = float(np.mean([samples[i].valid for i in idx]))
        out[f"calls/{agent}"] = float(len(idx))
        out[f"response_tokens/{agent}/mean"] = float(np.mean([len(samples[i].response_ids) for i in idx]))
    return out


def agent_reward_stats(stats: AgentRewardStats) -> dict[str, dict[str, float]]:
    """{agent: {"mean", "std", "count"}} of the running reward statistics, without the pooled key."""
    return {agent: values for agent, values in stats.summary().items() if agent != ALL}


def reward_stats_scalars(stats: AgentRewardStats) -> dict[str, float]:
    """`reward_stats/<agent>/mean|std|count` of the running statistics: each agent's reward level and spread
    over the window, i.e. what agent-wise normalisation corrects for and what singleton sets are scaled by
    (std is nan until an agent has two rewards)."""
    return {f"reward_stats/{agent}/{name}": value
            for agent, values in agent_reward_stats(stats).items() for name, value in values.items()}


def staleness_scalars(
    samples: Sequence[Sample], learner_version: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Version lag of each consumed sample, per agent: mean and max scalars plus the full histogram.

    The lag is counted against the version the update starts from, so 0 is on-policy and the staleness
    bound caps the max.
    """
    scalars: dict[str, float] = {}
    hists: dict[str, np.ndarray] = {}
    for agent, idx in _by_agent(samples).items():
        lags = np.array([version_lag(samples[i].policy_version, learner_version) for i in idx], dtype=np.int64)
        scalars[f"staleness/{agent}/mean"] = float(lags.mean())
        scalars[f"staleness/{agent}/max"] = float(lags.max())
        hists[f"staleness/{agent}"] = lags
    return scalars, hists
