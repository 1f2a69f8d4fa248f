"""Held-out accuracy around training: one episode per test problem, scored by the final answer.

Both loops measure it before and after training (greedy by default, `eval.temperature`) as `kinds.heldout`;
`drmas eval` measures avg@k / pass@k with k samples per question instead (`kinds.checkpoint`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from drmas.episodes import AgentSpec, EpisodeRunner
from drmas.evaluation.behaviour import behaviour_stats
from drmas.evaluation.evaluator import EvalSink, EvalSource, Evaluator
from drmas.tasks.base import Problem


class AccuracySink(EvalSink):
    """Reports `{"accuracy": mean task reward, "n": problems, "valid/<agent>": share of its valid samples,
    "info/<key>": mean of each numeric `EpisodeOutcome.info` entry over the episodes that have it}` ({} without
    problems) and writes nothing: the colocated loop logs it at once, the async launcher only
    after it has claimed the run directory (`accuracy_scalars`)."""

    def report(self, evaluation: Evaluator) -> dict[str, float]:
        outcomes = [o for name in evaluation.rows for row in evaluation.outcomes(name) for o in row]
        rewards = np.array([o.reward for o in outcomes], dtype=np.float64)
        if not len(rewards):
            return {}
        valid: dict[str, list[bool]] = {}
        for agent, ok, _, _ in evaluation.calls():
            valid.setdefault(agent, []).append(ok)
        out = {"accuracy": float(rewards.mean()), "n": float(len(rewards))}
        out.update({f"valid/{a}": float(np.mean(v)) for a, v in valid.items()})
        out.update({f"info/{k}": v for k, v in behaviour_stats(outcomes)["info"].items()})
        return out


def accuracy_scalars(accuracy: Mapping[str, Optional[float]]) -> dict[str, float]:
    """Tag ("before" / "after") -> accuracy as the metrics both loops log: `eval/accuracy_<tag>`."""
    return {f"eval/accuracy_{tag}": value for tag, value in accuracy.items() if value is not None}


def heldout_accuracy(runner: EpisodeRunner, problems: Sequence[Problem], tag: str = "eval",
                     agents: Optional[Mapping[str, AgentSpec]] = None) -> dict[str, float]:
    """One episode per problem on `runner` (sampled as `agents` say; None: as the runner samples), all in one
    call; accuracy = mean task reward of the system's final answer."""
    return Evaluator(EvalSource({"test": list(problems)}, agents=agents, tag=tag), AccuracySink()).run(runner)
