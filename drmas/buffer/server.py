"""`TrajectoryBuffer`: the ZeroMQ server between rollout processes and learners.

Sockets (`drmas.buffer.router`). Two ROUTER sockets, one per side: producers (`EpisodeMsg`, `AdmitRequest`)
and learners (`Pull`, `VersionUpdate`, `DropReport`); both accept `StatsRequest`. A message of the other
side's kind is refused as ``unexpected_message``.

Flow control by credit, never by silent dropping (`drmas.buffer.credit`): acks of new groups are parked
while the buffer is full, and a producer that ignores them is refused. An episode refused for any reason
of its own (a bad sample, the buffer full) takes its group down with it, counted, since that group could
never complete.

Delivery is at most once per agent group: groups leave the buffer when sent; a send to a learner that
has disconnected fails (ROUTER_MANDATORY) and the groups go back to the head of their queues.

The drawing order (`drmas.buffer.draws`): a grant hands out draw numbers, a group's episodes carry its draw
(an episode of a draw this buffer did not lease to its producer, or of a draw already trained, is refused),
and every way a group can be lost before training sends its draw back to be drawn again.

Threading: the poll loop runs either in the caller (`serve_forever`, for a process; `stop()` from a
signal handler ends it) or in a thread (`start`/`stop`, for tests and colocated use). `stats()` and
`discard()` are safe from any thread.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Union

from drmas.buffer.admission import AdmissionController
from drmas.buffer.credit import CreditGate
from drmas.buffer.draws import DrawLedger
from drmas.buffer.framing import AgentGroupView, EpisodeView, FrameLike, GroupBatchView, validated_samples
from drmas.buffer.messages import (
    CIRCUMSTANTIAL_DROPS,
    DROP_ALREADY_TRAINED,
    DROP_STALE,
    REJECT_UNEXPECTED,
    AbandonGroup,
    Ack,
    Acks,
    AdmitReply,
    AdmitRequest,
    DropReport,
    Heartbeat,
    MessageError,
    Pull,
    SampleHeader,
    Stats,
    StatsRequest,
    VersionUpdate,
)
from drmas.buffer.router import TICK_S, RouterServer
from drmas.buffer.store import (
    DROP_ABANDONED,
    DROP_REFUSED_EPISODE,
    GroupStore,
    QueuedGroup,
    StoredSample,
)
from drmas.config.buffer import BufferConfig
from drmas.core.draws import DrawSet
from drmas.core.sample import Sample
from drmas.runtime.netsec import CurveKeys

log = logging.getLogger(__name__)

REJECT_UNKNOWN_AGENT = "unknown_agent"
REJECT_MODEL_MISMATCH = "model_mismatch"
REJECT_UNKNOWN_MODEL = "unknown_model"
REJECT_NOT_ADMITTED = "not_admitted"  # a group of a draw this buffer did not lease to the producer
REJECT_ALREADY_TRAINED = "already_trained"  # a group of a draw a learner has trained already
DROP_MODEL_FINISHED = "model_finished"  # parts for a model whose learner finished: nobody will pull them
OTHER_REASON = "other"
_MAX_REPORTED_REASONS = 32  # distinct learner drop reasons kept apart; more are counted as OTHER_REASON



@dataclass
class _ParkedPull:
    identity: bytes
    request: Pull
    deadline: float


class TrajectoryBuffer(RouterServer):
    """Per-agent queues of complete GRPO groups behind two ZeroMQ ROUTER sockets.

    Args:
        config: endpoints, capacity, limits and timeouts.
        agent_models: agent name -> model id. With it, samples of unknown agents (or served by the
            wrong model) are refused and admission knows which models a group feeds.
        groups_per_step: model id -> groups one learner update consumes (needed with `max_staleness`).
        max_staleness: bound on version lag enforced at admission and at delivery (None: unbounded).
        curve: CURVE keys; default: read from the config's key files, or none.
        clock: monotonic time source (injectable for tests).
        journal: called with every change of which draws are out (`DrawLedger`).
        drawn_before: one past the highest draw an earlier buffer of the run handed out, and
        given_up_before: the draws it gave up (both read from its journal, `buffer/draws.jsonl`).
    """

    def __init__(
        self,
        config: BufferConfig,
        *,
        agent_models: Optional[Mapping[str, str]] = None,
        groups_per_step: Optional[Mapping[str, int]] = None,
        max_staleness: Optional[int] = None,
        curve: Optional[CurveKeys] = None,
        clock: Callable[[], float] = time.monotonic,
        journal: Optional[Callable[[dict], None]] = None,
        drawn_before: int = 0,
        given_up_before: Iterable[int] = (),
    ) -> None:
        config.validate("buffer")
        self._agent_models = dict(agent_models or {})
        self._store = GroupStore()
        self._admission = AdmissionController(
            self._agent_models, groups_per_step or {}, max_staleness, config.max_running_groups, config.lease_timeout_s
        )
        self._draws = DrawLedger(journal, drawn_before, given_up_before)
        self._reported_drops: Counter[str] = Counter()
        self._credit = CreditGate(config.capacity_samples, config.hard_capacity, config.window)
        self._producer_seen: dict[str, float] = {}  # producer id -> when it last sent anything
        self._parked_pulls: list[_ParkedPull] = []
        self._acks: dict[bytes, list[int]] = {}  # connection -> seqs of episodes stored this round, not yet acked
        # acks go out at the end of each round, and after every quarter window within one: all at the round's
        # end would hold a producer whose whole window arrived in one round until the round is done
        self._ack_every = max(1, config.window // 4)
        self._new_groups = False
        super().__init__(config, curve, clock)  # binds: from here on messages may arrive

    def _poll_timeout_ms(self) -> int:
        timeout = TICK_S
        if self._parked_pulls:
            timeout = min(timeout, min(p.deadline for p in self._parked_pulls) - self._clock())
        return max(0, math.ceil(timeout * 1000))

    # ---- producer side ----------------------------------------------------------------------------

    def _release_silent_producers(self, now: float) -> None:
        """Release what producers silent for `producer_timeout_s` held: their processes are gone (a rollout
        heartbeats from a thread of its own, also while it generates), so their admitted groups would
        otherwise block the staleness budget and their unfinished groups could never complete."""
        timeout = self.config.producer_timeout_s
        for producer in [p for p, seen in self._producer_seen.items() if now - seen > timeout]:
            del self._producer_seen[producer]
            groups = self._store.abandon_producer(producer)
            for group in groups:
                self._admission.on_abandoned(group.leased)
            leases = self._admission.release_producer(producer)
            self._draws.lost([g.draw for g in groups] + leases, f"producer {producer} went silent")
            if groups or leases:
                log.warning("buffer: producer %s silent for %.0f s: dropped %d unfinished groups (%d samples), "
                            "released %d admitted groups", producer, timeout, len(groups),
                            sum(g.n_samples for g in groups), len(leases))

    def _handle_producer(self, identity: bytes, message: object) -> None:
        producer = getattr(message, "producer", None)
        if producer is not None:
            self._producer_seen[producer] = self._clock()
        if isinstance(message, Heartbeat):
            return
        if isinstance(message, EpisodeView):
            self._on_episode(identity, message)
        elif isinstance(message, AdmitRequest):
            draws = self._draws.issue(self._admission.wanted(message.n_groups))
            self._admission.lease(message.producer, draws, self._clock())
            reply = AdmitReply(seq=message.seq, granted=len(draws), draws=draws,
                               versions=dict(self._admission.versions))
            self._send(self._producers, identity, reply)
        elif isinstance(message, StatsRequest):
            self._send(self._producers, identity, self._snapshot(message.seq))
        elif isinstance(message, AbandonGroup):
            self._abandon_group(message.producer, message.group_id, message.draw, DROP_ABANDONED,
                                f"its producer gave group {message.group_id} up (an episode of it was dropped)")
        else:
            raise MessageError(REJECT_UNEXPECTED, f"{type(message).__name__} belongs on the learner endpoint")

    def _on_episode(self, identity: bytes, episode: EpisodeView) -> None:
        try:
            opens_group = not self._store.is_pending(episode.group_id)
            self._check_draw(episode, opens_group)
            pairs = validated_samples(episode, self.config.validate_samples, self.config.max_sample_tokens)
            samples = [self._stored(sample, frame) for sample, frame in pairs]
            ack_now = self._credit.check(identity, self._store.held_samples, len(samples), opens_group)
        except MessageError:
            self._abandon_group(episode.producer, episode.group_id, episode.draw, DROP_REFUSED_EPISODE,
                                f"an episode of group {episode.group_id} was refused")
            raise
        rewards = [sample.reward for sample, _ in pairs] + list(episode.frozen_rewards)  # every call's reward
        completed = self._store.add_episode(
            episode.producer, episode.group_id, episode.group_size, episode.episode_id, samples, rewards,
            self._clock(), claim_lease=lambda: self._claim(episode), draw=episode.draw, prompt=episode.prompt,
        )
        if completed is not None:
            self._admission.on_complete(completed.models, completed.leased, completed.group_id, completed.parts)
            self._draws.completed(completed.draw, completed.agents)
            for model in completed.models & self._admission.finished:
                self._discard_model(model)
            self._new_groups = True
        if ack_now:
            pending = self._acks.setdefault(identity, [])
            pending.append(episode.seq)
            if len(pending) >= self._ack_every:
                self._send(self._producers, identity, Acks(seqs=pending))
                del self._acks[identity]
        else:
            self._credit.park(identity, episode.seq, len(samples))

    def _check_draw(self, episode: EpisodeView, opens_group: bool) -> None:
        """Refuse an episode of a draw already trained, or one opening a group of a draw this buffer did not
        lease to its producer (a grant of a buffer that restarted, or of a lease given up on): it would
        train a prompt twice."""
        draw = episode.draw
        if draw < 0:
            return
        if self._draws.is_settled(draw):
            raise MessageError(REJECT_ALREADY_TRAINED, f"draw {draw} is trained already")
        if opens_group and not self._store.is_closed(episode.group_id) and \
                not self._admission.holds(episode.producer, draw):
            raise MessageError(REJECT_NOT_ADMITTED, f"draw {draw} is not leased to {episode.producer} by this "
                                                    f"buffer (instance {self.instance})")

    def _claim(self, episode: EpisodeView) -> bool:
        """The episode opens its group: move its lease unit onto it (see `AdmissionController.claim`)."""
        draw = self._admission.claim(episode.producer, episode.draw)
        if draw is None:
            return False
        if episode.draw < 0:
            self._draws.unnumbered(draw)
        else:
            self._draws.opened(draw, episode.group_id)
        return True

    def _abandon_group(self, producer: str, group_id: str, draw: int, reason: str, why: str) -> None:
        """A group can never complete (an episode of it was refused, or its producer gave it up): drop what
        arrived of it (counted), refuse the rest of it, and give its admission slot (and its draw, to be drawn
        again) back now rather than after the incomplete timeout."""
        known = self._store.is_pending(group_id) or self._store.is_closed(group_id)
        group = self._store.abandon_group(group_id, reason)
        if group is not None:
            self._admission.on_abandoned(group.leased)
            self._draws.lost([group.draw], why, fault=True)
        elif not known:  # nothing of it arrived: return the unit (and the draw) leased for it
            claimed = self._admission.claim(producer, draw)
            self._admission.on_abandoned(claimed is not None)
            if claimed is not None:
                self._draws.lost([claimed], why, fault=True)

    def _stored(self, sample: Union[Sample, SampleHeader], frame: FrameLike) -> StoredSample:
        """Check a sample against the agent -> model map and keep its routing fields."""
        expected = self._agent_models.get(sample.agent)
        if self._agent_models and expected is None:
            raise MessageError(REJECT_UNKNOWN_AGENT, f"{sample.agent!r} is not one of {sorted(self._agent_models)}")
        if expected is not None and sample.model != expected:
            raise MessageError(REJECT_MODEL_MISMATCH, f"{sample.agent!r} is served by {expected!r}, not {sample.model!r}")
        return StoredSample(sample.agent, sample.model, sample.policy_version, frame)

    # ---- learner side -----------------------------------------------------------------------------

    def _handle_consumer(self, identity: bytes, message: object) -> None:
        if isinstance(message, Pull):
            self._on_pull(identity, message)
        elif isinstance(message, VersionUpdate):
            if self._agent_models and not self._admission.knows_model(message.model):
                raise MessageError(REJECT_UNKNOWN_MODEL, f"model {message.model!r} serves none of the agents")
            self._on_version(message)
            self._send(self._consumers, identity, Ack(seq=message.seq, accepted=True))
        elif isinstance(message, DropReport):
            self._on_drop_report(message)
            self._send(self._consumers, identity, Ack(seq=message.seq, accepted=True))
        elif isinstance(message, StatsRequest):
            self._send(self._consumers, identity, self._snapshot(message.seq))
        else:
            raise MessageError(REJECT_UNEXPECTED, f"{type(message).__name__} belongs on the producer endpoint")

    def _on_pull(self, identity: bytes, pull: Pull) -> None:
        unknown = [a for a in pull.agents if self._agent_models and a not in self._agent_models]
        if unknown:
            raise MessageError(REJECT_UNKNOWN_AGENT, f"unknown agents {unknown}")
        if self._answer_pull(identity, pull) or pull.wait_ms == 0:
            return
        self._parked_pulls.append(_ParkedPull(identity, pull, self._clock() + pull.wait_ms / 1000))

    def _answer_pull(self, identity: bytes, pull: Pull, allow_empty: bool = False) -> bool:
        """Send what is ready for `pull`; True if something (or, if allowed, an empty batch) was sent."""
        taken, dropped = self._store.take(pull.agents, pull.max_groups, self._stale_reason)
        for group in dropped:
            self._admission.on_dropped(group.group_id, group.model)
            self._draws.part_dropped(group.draw, group.agent, DROP_STALE)
        if not taken and not (allow_empty or pull.wait_ms == 0):
            return False
        batch = GroupBatchView(seq=pull.seq, groups=[self._view(g) for g in taken],
                               checked=self.config.validate_samples)
        if self._send(self._consumers, identity, batch):
            self._store.mark_delivered(taken)
            for group in taken:
                self._draws.delivered(group.draw, group.agent, group.model)
            return True
        self._store.requeue(taken)  # the learner went away: keep its groups for the next one
        self._new_groups = self._new_groups or bool(taken)
        return True

    def _stale_reason(self, group: QueuedGroup) -> Optional[str]:
        return self._admission.stale_reason(group.model, group.oldest_version)

    @staticmethod
    def _view(group: QueuedGroup) -> AgentGroupView:
        return AgentGroupView(
            group_id=group.group_id,
            agent=group.agent,
            model=group.model,
            samples=group.samples,
            episode_scores=group.episode_scores,
            group_rewards=group.group_rewards,
            draw=group.draw,
            prompt=group.prompt,
            group_agents=list(group.group_agents),
        )

    def _on_version(self, update: VersionUpdate) -> None:
        model = update.model
        before = self._admission.versions.get(model)
        if self._admission.update_version(model, update.version, update.incarnation, update.finished,
                                          self._store.queued_groups(model)):
            log.info("buffer: learner %s of %s reports version %d (was %s): its budget is recounted",
                     update.incarnation, model, update.version, before)
        if update.trained is not None:
            self._draws.report(model, update.incarnation, {  # only this model's agents: another's would be a lie
                agent: DrawSet(draws.floor, draws.extra) for agent, draws in update.trained.items()
                if self._agent_models.get(agent) == model})
        if update.finished:
            log.info("buffer: the learner of %s finished at version %d: its parts are no longer kept", model,
                     update.version)
            self._discard_model(model)

    def _discard_model(self, model: str) -> None:
        """Drop the queued parts of a finished model (counted): held, they would fill the buffer for good."""
        for agent in self._store.agents_of(model):
            for group in self._store.discard(agent, lambda group: group.model == model, DROP_MODEL_FINISHED):
                self._draws.part_dropped(group.draw, group.agent, DROP_MODEL_FINISHED, needed=False)

    def _on_drop_report(self, report: DropReport) -> None:
        """Learner-side drops were already delivered: count them apart and give their budget back."""
        reason = report.reason
        if reason not in self._reported_drops and len(self._reported_drops) >= _MAX_REPORTED_REASONS:
            reason = OTHER_REASON
        self._reported_drops[reason] += report.n_samples
        model = self._agent_models.get(report.agent)
        if model is not None:
            for group_id in report.group_ids:
                self._admission.on_dropped(group_id, model, whole=report.reason == DROP_ALREADY_TRAINED)
                draw = self._draws.group_draw(group_id)
                if draw is not None:
                    self._draws.part_dropped(draw, report.agent, f"its learner dropped it ({report.reason})", model,
                                             delivered=True, fault=report.reason not in CIRCUMSTANTIAL_DROPS)

    # ---- timers and parked requests ---------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        for group in self._store.expire_incomplete(now, self.config.incomplete_timeout_s):
            log.warning("buffer: discarded incomplete group %s of %s (%d samples)", group.group_id, group.producer,
                        group.n_samples)
            self._admission.on_abandoned(group.leased)
            self._draws.lost([group.draw], f"group {group.group_id} stayed incomplete")
        self._draws.lost(self._admission.expire(now), "their leases expired unclaimed")
        self._release_silent_producers(now)
        self._serve_parked_pulls(now)
        for identity, seq in self._credit.release(self._store.held_samples):
            self._acks.setdefault(identity, []).append(seq)

    def _end_round(self) -> None:
        """Acknowledge every episode stored this round not acknowledged yet, one `Acks` per producer connection:
        an ack each cost the buffer and the producer a message, an encode and a wake-up per episode. An ack is
        sent in the round its episode was stored in (or its parked ack released), so no ack waits longer than
        one round of the loop."""
        for identity, seqs in self._acks.items():
            self._send(self._producers, identity, Acks(seqs=seqs))
        self._acks.clear()

    def _serve_parked_pulls(self, now: float) -> None:
        """Answer parked pulls oldest first: with data when some arrived, empty when their wait is over."""
        if not self._parked_pulls:
            self._new_groups = False
            return
        check_data, self._new_groups = self._new_groups, False
        still_parked = []
        for parked in self._parked_pulls:
            expired = parked.deadline <= now
            if (check_data or expired) and self._answer_pull(parked.identity, parked.request, allow_empty=expired):
                continue
            still_parked.append(parked)
        self._parked_pulls = still_parked

    # ---- in-process API ---------------------------------------------------------------------------

    def discard(self, agent: str, predicate: Callable[[QueuedGroup], bool], reason: str) -> int:
        """Drop queued groups of `agent` matching `predicate` (any rule: staleness, a bad prompt, ...).

        Counted under `reason` in `Stats.dropped`; their staleness budget is given back. Returns the number
        of agent groups dropped. Parked acks are released on the loop's next tick.
        """
        with self._lock:
            dropped = self._store.discard(agent, predicate, reason)
            for group in dropped:
                self._admission.on_dropped(group.group_id, group.model)
                self._draws.part_dropped(group.draw, group.agent, reason)
            return len(dropped)

    def discard_stale(self) -> int:
        """Apply the staleness rule to every queue now rather than at delivery; returns groups dropped."""
        with self._lock:
            agents = list(self._store.depth())
        return sum(self.discard(agent, lambda g: self._stale_reason(g) is not None, DROP_STALE) for agent in agents)

    def stats(self) -> Stats:
        """A consistent snapshot of the counters (the same as a `StatsRequest` returns)."""
        with self._lock:
            return self._snapshot(0)

    def _snapshot(self, seq: int) -> Stats:
        store, admission = self._store, self._admission
        return Stats(
            instance=self.instance,
            seq=seq,
            capacity_samples=self.config.capacity_samples,
            samples_in_buffer=store.held_samples,
            depth=store.depth(),
            incomplete_groups=store.incomplete_groups,
            parked_acks=self._credit.parked,
            parked_pulls=len(self._parked_pulls),
            received_episodes=store.received_episodes,
            received_samples=store.received_samples,
            delivered_groups=store.delivered_groups,
            delivered_samples=store.delivered_samples,
            dropped=dict(store.ledger.samples),
            dropped_groups=dict(store.ledger.groups),
            rejected=dict(self._rejected),
            reported_drops=dict(self._reported_drops),
            model_versions=dict(admission.versions),
            accepted_groups=dict(admission.accepted),
            running_groups=admission.running,
            granted_groups=admission.granted_total,
            expired_lease_groups=admission.expired_total,
            draws=self._draws.counters(),
        )
