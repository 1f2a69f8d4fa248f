"""A learner's step batch: whole agent groups pulled from the buffer, checked for staleness, turned into
advantages.

One update consumes `groups_per_step` GRPO groups, the number the buffer's admission control assumes. The
buffer hands out one agent's part of a group at a time (round robin over this learner's agents, oldest
first), so a step asks for `missing groups x agents` parts and counts distinct group ids; a part that
arrives with the last group (another agent's part of a later group) is trained now rather than held back,
which only makes consumption a little faster than the admission budget assumes, never staler. Which step
a group's parts land in never changes their advantages: the pooled modes normalise against what the buffer
computed over the whole group (`group_advantages`).

The buffer already refuses to deliver data older than the bound at pull time; the learner checks again
because the buffer may have restarted without knowing versions. A part with a too-stale sample, or with a
sample of weights outside the learner's lineage (made by versions a killed learner published after its last
checkpoint, see `drmas.core.lineage`), or with a sample the model cannot take (`drmas.learner.sample_limits`:
token ids past its vocabulary, more tokens than its positions, non-finite values), is dropped whole (its
agent's advantages need the whole part) and reported, so the buffer counts it and frees its admission slot
for a replacement. So is a part of a draw this learner has trained already for that agent (`already_trained`:
the group of a draw handed out again for another agent, or by a restarted buffer): a learner never trains
one prompt twice for one agent. A part that makes up for one its agent lost, of a draw the learner's other
agents trained, is trained on top of the step's groups, so the steps of a resumed run train what those of an
uninterrupted run do (`drmas.buffer.draws`).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from drmas.buffer import AgentGroup, BufferConsumer
from drmas.buffer.messages import DROP_ALREADY_TRAINED, DROP_ORPHANED, DROP_STALE
from drmas.config.schema import AlgorithmConfig
from drmas.core.lineage import Lineage
from drmas.core.sample import Sample
from drmas.core.staleness import is_too_stale
from drmas.algorithms.estimators import AdvantageBatch, estimate
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.learner.sample_limits import SampleLimits
from drmas.runtime.process import StopFlag

log = logging.getLogger(__name__)

WAIT_REPORT_S = 30.0  # a learner still short of its step's groups says why this often


@dataclass
class StepBatch:
    groups: list[AgentGroup]
    wait_s: float  # time spent waiting on the buffer for these groups
    dropped: Counter = field(default_factory=Counter)  # reason -> samples dropped by the learner

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g.samples]

    def prompts_record(self) -> dict:
        """What the batch trains of the drawing order (`drmas.core.draws`), for `prompts.jsonl`: its draws in
        order, their problems' uids, and the draws each agent trains (a draw drawn again for one agent)."""
        drawn = {g.draw: g.prompt for g in self.groups if g.draw >= 0}
        agents: dict[str, list[int]] = {}
        for g in self.groups:
            if g.draw >= 0:
                agents.setdefault(g.agent, []).append(g.draw)
        return {"draws": sorted(drawn), "prompts": [drawn[d] for d in sorted(drawn)],
                "agents": {agent: sorted(draws) for agent, draws in sorted(agents.items())}}


@dataclass
class _Pending:
    """A batch being collected over several pulls."""
    batch: StepBatch
    group_ids: set[str]
    started: float
    report_at: float


class GroupCollector:
    """Pulls the agent groups of one learner step, dropping (and reporting) parts beyond the bound."""

    def __init__(self, consumer: BufferConsumer, agents: Sequence[str], groups_per_step: int,
                 max_staleness: int, stop: StopFlag, poll_ms: int = 200,
                 limits: SampleLimits | None = None, idle: Callable[[], None] | None = None,
                 trained: Callable[[AgentGroup], bool] | None = None,
                 makeup: Callable[[AgentGroup], bool] | None = None) -> None:
        """``idle``: called before every pull (at most ``poll_ms`` apart while the buffer has nothing): the
        learner serves rollouts that joined meanwhile from its own thread (see `WeightSender.serve_joins`).
        ``trained``: whether a part's draw was trained already for its agent (such a part is dropped).
        ``makeup``: whether a part makes up for one its agent lost of a draw this learner's other agents
        trained (a draw drawn again for one agent): it is trained in the step on top of its groups, so a
        resumed run's steps train what an uninterrupted run's do, agent by agent."""
        self.consumer = consumer
        self.trained = trained
        self.makeup = makeup
        self.idle = idle
        self.limits = limits
        self.agents = list(agents)
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.stop = stop
        self.poll_ms = poll_ms
        self.report_after_s = WAIT_REPORT_S
        self._foreign: Counter = Counter()  # (incarnation, version) -> samples dropped as orphaned while waiting
        self._pending: _Pending | None = None  # the batch being collected
        self._ahead: list[AgentGroup] = []  # parts of groups beyond a step's, pulled with it: the next step's first

    def next_batch(self, version: int, lineage: Lineage | None = None) -> StepBatch | None:
        """The groups the update from `version` trains on; None once stopped. With `lineage`, parts with
        samples of weights outside it are dropped as orphaned."""
        while not self.stop.is_set():
            batch = self.poll(version, lineage)
            if batch is not None:
                return batch
        return None

    def poll(self, version: int, lineage: Lineage | None = None, wait_ms: int | None = None) -> StepBatch | None:
        """One pull (waiting at most `wait_ms`, default `poll_ms`) towards the batch of the update from
        `version`: the batch once it is whole, else None (what arrived is kept for the next call). A learner
        of several models polls each in turn, so none blocks the others' updates."""
        now = time.monotonic()
        if self._pending is None:
            self._pending = _Pending(StepBatch([], 0.0), set(), now, now)
            self._foreign.clear()
            ahead, self._ahead = self._ahead, []
        else:
            ahead = []
        p, batch = self._pending, self._pending.batch
        if now - p.report_at >= self.report_after_s:
            p.report_at = now
            log.warning(self._waiting(version, len(p.group_ids), batch, now - p.started, lineage))
        if self.idle is not None:
            self.idle()
        if ahead and self._admit(ahead, version, lineage):  # the groups the last step's pull brought past it
            return self._complete()
        wanted = (self.groups_per_step - len(p.group_ids)) * len(self.agents)
        start = time.monotonic()
        try:
            parts = self.consumer.pull(self.agents, max_groups=wanted,
                                       wait_ms=self.poll_ms if wait_ms is None else wait_ms)
        except TimeoutError as exc:  # buffer down or restarting: keep asking
            log.warning("%s; retrying", exc)
            parts = []
        batch.wait_s += time.monotonic() - start
        batch.dropped.update(self.consumer.pop_undecodable())
        return self._complete() if self._admit(parts, version, lineage) else None

    def _admit(self, parts: Sequence[AgentGroup], version: int, lineage: Lineage | None) -> bool:
        """Put `parts` into the pending batch (or drop them, or keep those of groups past the step's for the next
        one); whether the batch has its `groups_per_step` groups now. A pull asks for the missing groups' parts
        of every agent, so where some agent has no part in them (a role the episodes never called) it can bring
        whole groups past the step's: they are the next step's, not more of this one."""
        p, batch = self._pending, self._pending.batch
        for part in parts:
            reason = self._refusal(part, version, lineage, batch)
            if reason is not None:
                self._drop(part, reason, batch)
                continue
            counted = part.draw < 0 or self.makeup is None or not self.makeup(part)
            if counted and part.group_id not in p.group_ids and len(p.group_ids) >= self.groups_per_step:
                self._ahead.append(part)
                continue
            batch.groups.append(part)
            if counted:
                p.group_ids.add(part.group_id)
        return len(p.group_ids) >= self.groups_per_step

    def _complete(self) -> StepBatch:
        batch, self._pending = self._pending.batch, None
        return batch

    def _refusal(self, part: AgentGroup, version: int, lineage: Lineage | None, batch: StepBatch) -> str | None:
        """Why `part` cannot be trained in the update from `version` (the drop reason), or None."""
        if any(is_too_stale(s.policy_version, version, self.max_staleness) for s in part.samples):
            return DROP_STALE
        foreign = [] if lineage is None else [(s.policy_incarnation, s.policy_version) for s in part.samples
                                                  if not lineage.contains(s.policy_incarnation, s.policy_version)]
        if foreign:
            self._foreign.update(foreign)
            return DROP_ORPHANED
        violation = self._violation(part)
        if violation is not None:
            return violation
        if part.draw >= 0 and ((self.trained is not None and self.trained(part)) or
                               any(g.agent == part.agent and g.draw == part.draw for g in batch.groups)):
            return DROP_ALREADY_TRAINED
        return None

    def _waiting(self, version: int, groups: int, batch: StepBatch, waited_s: float, lineage: Lineage | None) -> str:
        """Why the step from `version` still waits: a learner that waits in silence looks hung. Parts dropped
        as orphaned are the usual cause of a long wait -- rollouts still generating with another learner's
        weights (one that finished or was replaced) until they re-join this one -- so they are named."""
        line = (f"waiting {waited_s:.0f} s for the groups of the step from version {version}: {groups} of "
                f"{self.groups_per_step} so far")
        if not batch.dropped:
            return line + "; the buffer delivered nothing (are rollouts running, and do they reach the buffer?)"
        line += "; dropped meanwhile: " + ", ".join(f"{n} samples {reason}" for reason, n in batch.dropped.items())
        if self._foreign:
            stamps = ", ".join(f"{inc or '?'}@{v} ({n})" for (inc, v), n in self._foreign.most_common(3))
            mine = lineage.incarnation if lineage is not None else "?"
            line += (f". The orphaned samples were made by weights outside this learner's history (incarnation "
                     f"{mine}): {stamps} (learner incarnation@version). Rollouts switch to this learner's weights "
                     f"when they re-join it (within pipeline.weights.peer_timeout_s); a producer that keeps "
                     f"another learner's weights is never trained on here. To go on from a finished learner's "
                     f"weights instead, resume it: trainer.resume=true with its trainer.output_dir")
        return line

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
    """The samples of `groups` and their advantages, exactly as the colocated loop computes them.

    A learner gets its agents' parts of a group, not the group: the calls of agents other learners train or
    nobody trains (frozen ones) never reach it, and a group's other parts may land in another step or be
    dropped. So the estimator's view of each whole group is what the buffer computed when the group completed:
    its `episode_scores` (every episode's trajectory score) and `group_rewards` (every call's reward); a part
    from a buffer without `group_rewards` pools this learner's own calls of the group instead. The running
    statistics take this batch's rewards afterwards.
    """
    samples = [s for g in groups for s in g.samples]
    own: dict[str, list[float]] = {}
    for s in samples:
        own.setdefault(s.group_id, []).append(float(s.reward))
    pooled = {g.group_id: np.asarray(g.group_rewards, dtype=np.float64) for g in groups if g.group_rewards}
    batch = AdvantageBatch.of(
        samples, {(g.group_id, e): score for g in groups for e, score in g.episode_scores.items()},
        {g: pooled.get(g, np.asarray(r, dtype=np.float64)) for g, r in own.items()},
    )
    adv = estimate(batch, alg, stats)
    stats.update([s.agent for s in samples], [s.reward for s in samples])
    return samples, adv
