"""Advantage estimators: the registry, what an estimator sees, and the one call both training loops make.

An estimator turns one training step's rewards into one advantage per trained call. It is chosen by name
(`algorithm.estimator`) from `ADVANTAGE_ESTIMATORS`, which the built-ins (`normalised.py`,
`leave_one_out.py`) and plugins fill alike, and called as ``estimator(batch, context) -> advantages``.

What it sees is the same in both loops, so an estimator gives the same numbers colocated and async by
construction: an `AdvantageBatch` holds the calls one model trains this step (reward, group, episode,
agent, turn) plus what the whole of each of their groups says -- every episode's trajectory score and every
call's reward, the calls of other models' agents and of frozen agents included. The colocated loop builds it
from every sample in hand (`AdvantageBatch.from_samples`); an async learner from the parts the buffer
delivered, whose groups' scores and rewards the buffer computed when each group completed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence

import numpy as np

from drmas.algorithms.advantage import normalise_to
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.core.registry import Registry

if TYPE_CHECKING:
    from drmas.config.schema import AlgorithmConfig
    from drmas.core.sample import Sample


@dataclass(frozen=True)
class AdvantageBatch:
    """The calls to score (one row each) and their groups' context. Rows: `reward` (float64), `group`,
    `episode`, `agent` (str) and `turn` (int64, the call's index within its episode across agents).
    `episode_scores[(group, episode)]`: the trajectory score (mean reward of all the episode's calls) of every
    episode of every group present; `group_rewards[group]`: the reward of every call of the group."""

    reward: np.ndarray
    group: np.ndarray
    episode: np.ndarray
    agent: np.ndarray
    turn: np.ndarray
    episode_scores: Mapping[tuple[str, str], float] = field(default_factory=dict)
    group_rewards: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Refuse what would corrupt a step's gradients silently: misaligned rows, a non-finite reward, a call
        whose group or episode has no context."""
        n = len(self.reward)
        lengths = {name: len(getattr(self, name)) for name in ("reward", "group", "episode", "agent", "turn")}
        if len(set(lengths.values())) != 1:
            raise ValueError(f"an advantage batch's rows must have equal lengths, got {lengths}")
        _finite("rewards", self.reward)
        for (group, episode), score in self.episode_scores.items():
            if not math.isfinite(score):
                raise ValueError(f"episode {episode} of group {group} has a non-finite trajectory score {score}")
        for group, rewards in self.group_rewards.items():
            _finite(f"group {group}'s rewards", rewards)
        groups = set(self.group.tolist())
        if n and (lost := groups - set(self.group_rewards)):
            raise ValueError(f"group {sorted(lost)[0]} has calls to score but no group_rewards")
        scored = set(self.episode_scores)
        missing = [key for key in zip(self.group.tolist(), self.episode.tolist()) if key not in scored]
        if missing:
            raise ValueError(f"episode {missing[0][1]} of group {missing[0][0]} has calls but no trajectory score")

    @classmethod
    def from_samples(cls, samples: Sequence[Sample], every: Optional[Sequence[Sample]] = None) -> AdvantageBatch:
        """The batch of `samples` with their groups' context taken from `every` (default: `samples`): all the
        calls of their groups, as the colocated loop has them (frozen agents' and other models' too)."""
        every = samples if every is None else every
        calls: dict[tuple[str, str], list[float]] = {}
        pooled: dict[str, list[float]] = {}
        for s in every:
            calls.setdefault((s.group_id, s.episode_id), []).append(float(s.reward))
            pooled.setdefault(s.group_id, []).append(float(s.reward))
        return cls.of(samples, {key: sum(r) / len(r) for key, r in calls.items()},  # as the buffer scores them
                      {g: np.array(r, dtype=np.float64) for g, r in pooled.items()})

    @classmethod
    def of(cls, samples: Sequence[Sample], episode_scores: Mapping[tuple[str, str], float],
           group_rewards: Mapping[str, np.ndarray]) -> AdvantageBatch:
        """The batch of `samples` (one row each) with their groups' context as given."""
        return cls(
            reward=np.array([s.reward for s in samples], dtype=np.float64),
            group=np.array([s.group_id for s in samples], dtype=str),
            episode=np.array([s.episode_id for s in samples], dtype=str),
            agent=np.array([s.agent for s in samples], dtype=str),
            turn=np.array([s.turn for s in samples], dtype=np.int64),
            episode_scores=episode_scores,
            group_rewards=group_rewards,
        )

    def __len__(self) -> int:
        return len(self.reward)

    def episodes(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores, group of each, the episode index of each call) over every episode of the batch's groups."""
        groups = set(self.group.tolist())
        keys = sorted(key for key in self.episode_scores if key[0] in groups)
        index = {key: i for i, key in enumerate(keys)}
        scores = np.array([self.episode_scores[k] for k in keys], dtype=np.float64)
        of_call = np.array([index[k] for k in zip(self.group.tolist(), self.episode.tolist())], dtype=np.int64)
        return scores, np.array([k[0] for k in keys], dtype=str), of_call

    def group_pool(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(every call's reward in the batch's groups, the group code of each, the group code of each row)."""
        names = sorted(set(self.group.tolist()))
        code = {g: i for i, g in enumerate(names)}
        pool = [self.group_rewards[g] for g in names]
        pool_codes = np.concatenate([np.full(len(r), code[g]) for g, r in zip(names, pool)]) if pool else np.zeros(0)
        values = np.concatenate(pool) if pool else np.zeros(0)
        return values, pool_codes.astype(np.int64), np.array([code[g] for g in self.group.tolist()], dtype=np.int64)


@dataclass(frozen=True)
class EstimatorContext:
    """What an estimator may use beside the batch: the `algorithm` section (its own knobs: `norm_by_std`,
    `eps`, the singleton settings) and the running per-agent statistics of earlier steps' rewards (the pooled
    key `ALL` too). The statistics take this step's rewards only after every estimate of the step."""

    alg: AlgorithmConfig
    stats: AgentRewardStats

    @property
    def running(self) -> Optional[AgentRewardStats]:
        """The statistics a one-member set is centred on (None: `singleton_fallback` is off)."""
        return self.stats if self.alg.singleton_fallback else None

    def normalise(self, values: np.ndarray, codes: np.ndarray, pool: np.ndarray, pool_codes: np.ndarray,
                  stat_keys: np.ndarray, by_std: Optional[bool] = None) -> np.ndarray:
        """`values` against the moments of their sets in `pool` with this run's settings (`by_std`: override
        `norm_by_std`); a one-member set is centred on the running statistics of its `stat_keys` entry."""
        std = self.alg.norm_by_std if by_std is None else by_std
        return normalise_to(values, codes, pool, pool_codes, stat_keys, std, self.alg.eps, self.running,
                            self.alg.singleton_clip)

    def baseline(self, key: str) -> float:
        """The running mean of `key` (an agent, or `ALL`) when a one-member set needs one; 0 while unknown."""
        running = self.running
        return running.mean(key) if running is not None and running.count(key) >= 2 else 0.0

    def clip_single(self, values: np.ndarray) -> np.ndarray:
        bound = self.alg.singleton_clip
        return values if bound is None else np.clip(values, -bound, bound)


Estimator = Callable[[AdvantageBatch, EstimatorContext], np.ndarray]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def estimate(batch: AdvantageBatch, alg: AlgorithmConfig, stats: AgentRewardStats) -> np.ndarray:
    """One float64 advantage per row of `batch`, by the estimator `alg` names; what it returns is checked."""
    name = alg.chosen_estimator
    estimator = ADVANTAGE_ESTIMATORS.lookup(name, "algorithm.estimator")
    if not len(batch):
        return np.zeros(0, dtype=np.float64)
    adv = np.asarray(estimator(batch, EstimatorContext(alg, stats)), dtype=np.float64)
    if adv.shape != (len(batch),):
        raise ValueError(f"advantage estimator {name!r} returned shape {adv.shape} for {len(batch)} calls")
    _finite(f"advantage estimator {name!r}'s advantages", adv)
    return adv


def step_advantages(samples: Sequence[Sample], alg: AlgorithmConfig, stats: AgentRewardStats,
                    every: Optional[Sequence[Sample]] = None) -> np.ndarray:
    """Advantages of one model's `samples` in the colocated loop (`every`: all the step's samples, their groups'
    context), and only then do the step's rewards join `stats`: a one-member set's baseline must not contain
    its own reward. A loop training several models estimates each and updates the statistics once (`estimate`)."""
    adv = estimate(AdvantageBatch.from_samples(samples, every), alg, stats)
    seen = samples if every is None else every
    stats.update([s.agent for s in seen], [s.reward for s in seen])
    return adv


def _finite(what: str, values: np.ndarray) -> None:
    bad = ~np.isfinite(np.asarray(values, dtype=np.float64))
    if bad.any():
        raise ValueError(f"{what} contain {int(bad.sum())} non-finite value(s)")

