"""A learner's step batch: whole agent groups pulled from the buffer, checked for staleness, turned into
advantages.

One update consumes `groups_per_step` GRPO groups, the number the buffer's admission control assumes. The
buffer hands out one agent's part of a group at a time (round robin over this learner's agents, oldest
first), so a step asks for `missing groups x agents` parts and counts distinct group ids; a part that
arrives with the last group (another agent's part of a later group) is trained now rather than held back,
which only makes consumption a little faster than the admission budget assumes, never staler.

The buffer already refuses to deliver data older than the bound at pull time; the learner checks again
because the buffer may have restarted without knowing versions. A part with a too-stale sample, or with a
sample of weights outside the learner's lineage (made by versions a killed learner published after its last
checkpoint, see `drmas.lineage`), or with a sample the model cannot take (`drmas.learner.sample_limits`:
token ids past its vocabulary, more tokens than its positions, non-finite values), is dropped whole (its
agent's advantages need the whole part) and reported, so the buffer counts it and frees its admission slot
for a replacement.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from drmas.buffer import AgentGroup, BufferConsumer
from drmas.config.schema import AlgorithmConfig
from drmas.learner.advantage import compute_advantages, config_options, step_advantages
from drmas.learner.running_stats import AgentRewardStats
from drmas.learner.sample_limits import SampleLimits
from drmas.lineage import Lineage
from drmas.process import StopFlag
from drmas.protocol import Sample
from drmas.staleness import is_too_stale

log = logging.getLogger(__name__)

DROP_STALE = "stale"
DROP_ORPHANED = "orphaned"


@dataclass
class StepBatch:
    groups: list[AgentGroup]
    wait_s: float  # time spent waiting on the buffer for these groups
    dropped: Counter = field(default_factory=Counter)  # reason -> samples dropped by the learner

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]


class GroupCollector:
    """Pulls the agent groups of one learner step, dropping (and reporting) parts beyond the bound."""

    def __init__(self, consumer: BufferConsumer, agents: Sequence[str], groups_per_step: int,
                 max_staleness: int, stop: StopFlag, poll_ms: int = 200,
                 limits: SampleLimits | None = None) -> None:
        self.consumer = consumer
        self.limits = limits
        self.agents = list(agents)
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.stop = stop
        self.poll_ms = poll_ms

    def next_batch(self, version: int, lineage: Lineage | None = None) -> StepBatch | None:
        """The groups the update from `version` trains on; None once stopped. With `lineage`, parts with
        samples of weights outside it are dropped as orphaned."""
        batch = StepBatch([], 0.0)
        group_ids: set[str] = set()
        while len(group_ids) < self.groups_per_step:
            if self.stop.is_set():
                return None
            wanted = (self.groups_per_step - len(group_ids)) * len(self.agents)
            start = time.monotonic()
            try:
                parts = self.consumer.pull(self.agents, max_groups=wanted, wait_ms=self.poll_ms)
            except TimeoutError as exc:  # buffer down or restarting: keep asking
                log.warning("%s; retrying", exc)
                parts = []
            batch.wait_s += time.monotonic() - start
            batch.dropped.update(self.consumer.pop_undecodable())
            for part in parts:
                if any(is_too_stale(s.policy_version, version, self.max_staleness) for s in part.samples):
                    self._drop(part, DROP_STALE, batch)
                    continue
                if lineage is not None and not all(
                        lineage.contains(s.policy_incarnation, s.policy_version) for s in part.samples):
                    self._drop(part, DROP_ORPHANED, batch)
                    continue
                violation = self._violation(part)
                if violation is not None:
                    self._drop(part, violation, batch)
                    continue
                batch.groups.append(part)
                group_ids.add(part.group_id)
        return batch

    def _violation(self, part: AgentGroup) -> str | None:
        if self.limits is None:
            return None
        for sample in part.samples:
            reason = self.limits.violation(sample)
            if reason is not None:
                log.warning("dropping group %s/%s: a sample of episode %s is %s for this model", part.group_id,
                            part.agent, sample.episode_id, reason)
                return reason
        return None

    def _drop(self, part: AgentGroup, reason: str, batch: StepBatch) -> None:
        batch.dropped[reason] += len(part.samples)
        report_drops(self.consumer, [part], reason)


def report_drops(consumer: BufferConsumer, parts: Sequence[AgentGroup], reason: str) -> None:
    """Tell the buffer these delivered parts will not be trained on (counted there, their budget refilled)."""
    for part in parts:
        try:
            consumer.report_drops(part.agent, [part.group_id], len(part.samples), reason)
        except TimeoutError as exc:  # counted here anyway; the buffer's budget recovers on the next version
            log.warning("could not report a dropped group to the buffer: %s", exc)


def group_advantages(
    groups: Sequence[AgentGroup], alg: AlgorithmConfig, stats: AgentRewardStats
) -> tuple[list[Sample], np.ndarray]:
    """The samples of `groups` and their advantages, as the colocated loop computes them.

    `agent` and `step_global` need only the samples at hand. `global` scores whole trajectories, including
    the calls of agents other learners train, so it normalises the buffer's `episode_scores` (every episode
    of the group) instead of this learner's samples, then gives each sample its episode's advantage. The
    running statistics take this batch's rewards afterwards.
    """
    samples = [s for g in groups for s in g.samples]
    if alg.normalization != "global":
        return samples, step_advantages(samples, alg, stats)
    episodes = {(g.group_id, e): score for g in groups for e, score in g.episode_scores.items()}
    keys = list(episodes)
    episode_adv = compute_advantages([episodes[k] for k in keys], [k[0] for k in keys], ["all"] * len(keys),
                                     [k[1] for k in keys], **config_options(alg, stats))
    stats.update([s.agent for s in samples], [s.reward for s in samples])
    by_episode = dict(zip(keys, episode_adv))
    return samples, np.array([by_episode[(s.group_id, s.episode_id)] for s in samples], dtype=np.float64)
