"""Held-out accuracy around training: one episode per test problem, scored by the final answer.

The colocated loop calls it before and after training (greedy by default); `drmas eval` measures
avg@k / pass@k with k samples per question instead (see `drmas.evaluation.command`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from drmas.episodes import EpisodeRequest, EpisodeRunner
from drmas.tasks.base import Problem


def heldout_accuracy(runner: EpisodeRunner, problems: Sequence[Problem], tag: str = "eval") -> dict[str, float]:
    """One episode per problem; accuracy = mean task reward of the system's final answer."""
    if not problems:
        return {}
    requests = [EpisodeRequest(f"{tag}-{p.uid}", f"{tag}-{p.uid}", p) for p in problems]
    results = runner.run(requests)
    rewards = np.array([r.outcome.reward for r in results], dtype=np.float64)
    valid: dict[str, list[bool]] = {}
    for r in results:
        for s in r.samples:
            valid.setdefault(s.agent, []).append(s.valid)
    out = {"accuracy": float(rewards.mean()), "n": float(len(problems))}
    out.update({f"valid/{a}": float(np.mean(v)) for a, v in valid.items()})
    return out
