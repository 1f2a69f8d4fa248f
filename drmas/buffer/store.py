"""Group assembly and per-agent queues: the buffer's data structure, without sockets or clocks.

Episodes of one GRPO group arrive one by one (possibly from several producers). A group is kept
*pending* until all `group_size` episodes are in; then it is split into one `QueuedGroup` per agent,
appended to that agent's FIFO queue. Learners take whole queued groups, never parts of one, because
advantages need every episode of the group. What the pooled normalisation modes need from the agents a
learner does not train (every episode's trajectory score and every call's reward) is computed once, when
the group completes, and travels with each part, so it does not matter which step the other parts land in
or whether they are dropped.

Every sample that enters is accounted for until it leaves, either delivered or dropped with a reason, so
``received == delivered + dropped + held`` holds at all times (the buffer's "nothing silently lost").
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Sequence

REFUSE_DUPLICATE = "duplicate_episode"
REFUSE_SIZE_MISMATCH = "group_size_mismatch"
REFUSE_LATE = "late_episode"
REFUSE_DISCARDED = "group_discarded"
REFUSE_DRAW_MISMATCH = "draw_mismatch"
DROP_INCOMPLETE = "incomplete_group"
DROP_PRODUCER_GONE = "producer_gone"
DROP_REFUSED_EPISODE = "refused_episode"  # a group one of whose episodes was refused can never complete
DROP_ABANDONED = "abandoned_group"  # its producer gave it up: one of its episodes will never finish
_CLOSED_COMPLETE = "complete"


class EpisodeRefused(Exception):
    """An episode that cannot join its group; `reason` is a counting code, `detail` for humans."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class StoredSample(NamedTuple):
    """A validated sample: its routing fields decoded, its bytes kept where they arrived (the received frame,
    or a view of it: see `drmas.buffer.framing`). A tuple: one is made per sample the buffer takes in."""

    agent: str
    model: str
    policy_version: int
    frame: Any


@dataclass
class QueuedGroup:
    """One agent's part of a complete group, waiting in that agent's queue."""

    group_id: str
    agent: str
    model: str
    samples: list[Any]  # the samples' bytes as received (see `StoredSample`)
    episode_scores: dict[str, float]  # shared by all parts of the group
    group_rewards: list[float]  # every call's reward in the group, frozen agents' too; shared by all parts
    oldest_version: int  # policy version of the oldest sample: what staleness is judged on
    order: int  # completion order across all agents, for oldest-first delivery
    draw: int = -1  # the group's draw number (`drmas.buffer.draws`), -1 outside the drawing order
    prompt: str = ""
    group_agents: tuple[str, ...] = ()  # the agents with a part of the group

    @property
    def n_samples(self) -> int:
        return len(self.samples)


@dataclass
class CompletedGroup:
    """What completing a group produced, for the admission bookkeeping."""

    group_id: str
    producer: str
    leased: bool
    models: frozenset[str]
    draw: int = -1
    agents: frozenset[str] = frozenset()  # the agents with a part of the group
    parts: dict[str, int] = field(default_factory=dict)  # model -> its agents' parts of the group


@dataclass
class AbandonedGroup:
    """An incomplete group given up on (its producer went quiet)."""

    group_id: str
    producer: str
    leased: bool
    n_samples: int
    draw: int = -1


@dataclass
class _PendingGroup:
    group_id: str
    group_size: int
    producer: str
    leased: bool
    last_activity: float
    draw: int = -1
    prompt: str = ""
    episodes: dict[str, list[StoredSample]] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, list[float]] = field(default_factory=dict)  # episode -> every call's reward
    n_samples: int = 0


class DiscardLedger:
    """Counts of everything dropped after it was accepted, by reason (samples and groups)."""

    def __init__(self) -> None:
        self.samples: Counter[str] = Counter()
        self.groups: Counter[str] = Counter()

    def record(self, reason: str, n_samples: int, n_groups: int = 1) -> None:
        self.samples[reason] += n_samples
        self.groups[reason] += n_groups


class _ClosedGroups:
    """Recently closed group ids, so a straggling episode is refused instead of starting a ghost group.

    Bounded (oldest forgotten first): memory must not grow with the length of training.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._reasons: OrderedDict[str, str] = OrderedDict()

    def close(self, group_id: str, reason: str) -> None:
        self._reasons[group_id] = reason
        if len(self._reasons) > self._limit:
            self._reasons.popitem(last=False)

    def reason(self, group_id: str) -> Optional[str]:
        return self._reasons.get(group_id)


class GroupStore:
    """Pending groups, per-agent queues of complete groups, and the sample accounting."""

    def __init__(self, closed_memory: int = 100_000) -> None:
        self._pending: OrderedDict[str, _PendingGroup] = OrderedDict()  # least recently active first
        self._queues: dict[str, deque[QueuedGroup]] = {}
        self._closed = _ClosedGroups(closed_memory)
        self._order = 0
        self.ledger = DiscardLedger()
        self.held_samples = 0
        self.received_episodes = 0
        self.received_samples = 0
        self.delivered_groups = 0
        self.delivered_samples = 0

    # ---- arrival ----------------------------------------------------------------------------------

    def is_pending(self, group_id: str) -> bool:
        return group_id in self._pending

    def is_closed(self, group_id: str) -> bool:
        """Whether the group completed or was given up on (recently enough to be remembered)."""
        return self._closed.reason(group_id) is not None

    def add_episode(
        self,
        producer: str,
        group_id: str,
        group_size: int,
        episode_id: str,
        samples: Sequence[StoredSample],
        rewards: Sequence[float],
        now: float,
        claim_lease: Callable[[], bool],
        draw: int = -1,
        prompt: str = "",
    ) -> Optional[CompletedGroup]:
        """Add one episode; returns the completed group when this episode was its last one.

        `rewards` are the rewards of all the episode's calls (the samples' and those of calls not sent); their
        mean is the episode's trajectory score.

        `claim_lease` is called only when the episode opens a new group, so the admission bookkeeping
        can tie one admitted unit to it; it is not called for refused episodes. `draw` (and `prompt`, its
        problem's uid) come with every episode of a group and must agree.
        """
        group = self._pending.get(group_id)
        if group is None:
            self._refuse_closed(group_id)
            group = _PendingGroup(group_id, group_size, producer, leased=claim_lease(), last_activity=now,
                                  draw=draw, prompt=prompt)
            self._pending[group_id] = group
        else:
            self._refuse_misfit(group, group_size, episode_id, draw)
        group.episodes[episode_id] = list(samples)
        group.scores[episode_id] = sum(rewards) / len(rewards)
        group.rewards[episode_id] = list(rewards)
        group.n_samples += len(samples)
        group.last_activity = now
        self._pending.move_to_end(group_id)
        self.held_samples += len(samples)
        self.received_episodes += 1
        self.received_samples += len(samples)
        if len(group.episodes) < group.group_size:
            return None
        return self._complete(group)

    def _refuse_closed(self, group_id: str) -> None:
        closed = self._closed.reason(group_id)
        if closed == _CLOSED_COMPLETE:
            raise EpisodeRefused(REFUSE_LATE, f"group {group_id} is already complete")
        if closed is not None:
            raise EpisodeRefused(REFUSE_DISCARDED, f"group {group_id} was discarded ({closed})")

    @staticmethod
    def _refuse_misfit(group: _PendingGroup, group_size: int, episode_id: str, draw: int) -> None:
        if episode_id in group.episodes:
            raise EpisodeRefused(REFUSE_DUPLICATE, f"episode {episode_id} already in group {group.group_id}")
        if group_size != group.group_size:
            raise EpisodeRefused(
                REFUSE_SIZE_MISMATCH, f"group {group.group_id} has size {group.group_size}, episode says {group_size}"
            )
        if draw != group.draw:
            raise EpisodeRefused(REFUSE_DRAW_MISMATCH, f"group {group.group_id} is draw {group.draw}, episode "
                                                       f"{episode_id} says {draw}")

    def _complete(self, group: _PendingGroup) -> CompletedGroup:
        """Split a complete group by agent and queue each part (episode order, then call order)."""
        del self._pending[group.group_id]
        self._closed.close(group.group_id, _CLOSED_COMPLETE)
        by_agent: dict[str, list[StoredSample]] = {}
        for samples in group.episodes.values():
            for sample in samples:
                by_agent.setdefault(sample.agent, []).append(sample)
        self._order += 1
        group_rewards = [r for rewards in group.rewards.values() for r in rewards]
        for agent, samples in by_agent.items():
            part = QueuedGroup(
                group_id=group.group_id,
                agent=agent,
                model=samples[0].model,
                samples=[s.frame for s in samples],
                episode_scores=group.scores,
                group_rewards=group_rewards,
                oldest_version=min(s.policy_version for s in samples),
                order=self._order,
                draw=group.draw,
                prompt=group.prompt,
                group_agents=tuple(sorted(by_agent)),
            )
            self._queues.setdefault(agent, deque()).append(part)
        parts = Counter(samples[0].model for samples in by_agent.values())
        return CompletedGroup(group.group_id, group.producer, group.leased, frozenset(parts), group.draw,
                              frozenset(by_agent), dict(parts))

    # ---- departure --------------------------------------------------------------------------------

    def take(
        self, agents: Sequence[str], max_groups: int, reject: Callable[[QueuedGroup], Optional[str]]
    ) -> tuple[list[QueuedGroup], list[QueuedGroup]]:
        """Take up to `max_groups` queued groups of `agents`, fairly: round robin over the agents, each
        round visiting them oldest head first. A group `reject` names a reason for is dropped instead.

        Returns (taken, dropped). Taken groups leave the accounting until `mark_delivered` or `requeue`.
        """
        taken: list[QueuedGroup] = []
        dropped: list[QueuedGroup] = []
        wanted = list(dict.fromkeys(agents))
        while len(taken) < max_groups:
            heads = sorted((self._queues[a][0].order, a) for a in wanted if self._queues.get(a))
            if not heads:
                break
            for _, agent in heads:
                if len(taken) >= max_groups:
                    break
                group = self._queues[agent].popleft()
                self.held_samples -= group.n_samples
                reason = reject(group)
                if reason is None:
                    taken.append(group)
                else:
                    self.ledger.record(reason, group.n_samples)
                    dropped.append(group)
        return taken, dropped

    def mark_delivered(self, groups: Sequence[QueuedGroup]) -> None:
        self.delivered_groups += len(groups)
        self.delivered_samples += sum(g.n_samples for g in groups)

    def requeue(self, groups: Sequence[QueuedGroup]) -> None:
        """Put taken groups back at the head of their queues (a delivery failed), keeping their order."""
        for group in reversed(groups):
            self._queues.setdefault(group.agent, deque()).appendleft(group)
            self.held_samples += group.n_samples

    def discard(self, agent: str, predicate: Callable[[QueuedGroup], bool], reason: str) -> list[QueuedGroup]:
        """Drop every queued group of `agent` matching `predicate`, counted under `reason`."""
        queue = self._queues.get(agent)
        if not queue:
            return []
        kept: deque[QueuedGroup] = deque()
        dropped: list[QueuedGroup] = []
        for group in queue:
            (dropped if predicate(group) else kept).append(group)
        self._queues[agent] = kept
        for group in dropped:
            self.held_samples -= group.n_samples
            self.ledger.record(reason, group.n_samples)
        return dropped

    def expire_incomplete(self, now: float, timeout_s: float) -> list[AbandonedGroup]:
        """Drop pending groups without a new episode for `timeout_s` (least recently active first)."""
        abandoned = []
        while self._pending:
            group = next(iter(self._pending.values()))
            if now - group.last_activity < timeout_s:
                break
            abandoned.append(self._drop_pending(group, DROP_INCOMPLETE))
        return abandoned

    def abandon_group(self, group_id: str, reason: str) -> Optional[AbandonedGroup]:
        """Give up on a group that cannot complete (an episode refused, or given up by its producer): drop it if pending,
        and refuse its later episodes either way. Returns the dropped pending group, if there was one."""
        group = self._pending.get(group_id)
        if group is not None:
            return self._drop_pending(group, reason)
        if self._closed.reason(group_id) is None:
            self._closed.close(group_id, reason)
        return None

    def abandon_producer(self, producer: str) -> list[AbandonedGroup]:
        """Drop the pending groups `producer` was filling: it is gone, so they can never complete."""
        gone = [g for g in self._pending.values() if g.producer == producer]
        return [self._drop_pending(group, DROP_PRODUCER_GONE) for group in gone]

    def _drop_pending(self, group: _PendingGroup, reason: str) -> AbandonedGroup:
        """Forget a pending group for good (late episodes of it are refused), counting its samples."""
        del self._pending[group.group_id]
        self._closed.close(group.group_id, reason)
        self.held_samples -= group.n_samples
        self.ledger.record(reason, group.n_samples)
        return AbandonedGroup(group.group_id, group.producer, group.leased, group.n_samples, group.draw)

    # ---- views ------------------------------------------------------------------------------------

    def depth(self) -> dict[str, int]:
        return {agent: len(queue) for agent, queue in self._queues.items()}

    def queued_groups(self, model: str) -> int:
        """Complete groups with a part for `model` still queued (a restarted learner's budget counts them)."""
        return len({g.group_id for queue in self._queues.values() for g in queue if g.model == model})

    def agents_of(self, model: str) -> list[str]:
        """Agents with queued parts of `model`."""
        return [agent for agent, queue in self._queues.items() if any(g.model == model for g in queue)]

    @property
    def incomplete_groups(self) -> int:
        return len(self._pending)
