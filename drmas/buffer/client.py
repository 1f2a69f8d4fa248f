"""Clients of the trajectory buffer: `BufferProducer` (rollout side) and `BufferConsumer` (learner side).

Both are DEALER sockets that never block without a deadline: every wait ends in a `TimeoutError` that
names the endpoint, so a dead or unreachable buffer (or a CURVE key it does not accept, which looks the
same from the outside) surfaces as an error instead of a hang.

Neither is thread-safe (ZeroMQ sockets are not); use one per thread.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import zmq

from drmas.buffer.framing import ClientReply, GroupBatchView, decode_client_reply, encode_frames, open_group
from drmas.buffer.messages import (
    AbandonGroup,
    Ack,
    Acks,
    AdmitReply,
    AdmitRequest,
    AgentGroup,
    DropReport,
    Draws,
    EpisodeMsg,
    Heartbeat,
    MessageError,
    Pull,
    Stats,
    StatsRequest,
    VersionUpdate,
    encode_message,
)
from drmas.config.buffer import BufferConfig
from drmas.core.draws import DrawSet
from drmas.core.sample import Sample
from drmas.runtime.netsec import CurveClientKeys, client_keys

log = logging.getLogger(__name__)


class BufferRejected(RuntimeError):
    """The buffer refused a request; `reason` is its counting code (see `Stats.rejected`)."""

    def __init__(self, endpoint: str, ack: Ack) -> None:
        super().__init__(f"trajectory buffer at {endpoint} refused request {ack.seq}: {ack.reason} {ack.detail}")
        self.reason = ack.reason
        self.detail = ack.detail


@dataclass(frozen=True)
class Rejection:
    """An episode the buffer refused (it is not in the buffer and was not counted as received)."""

    seq: int
    episode_id: str
    reason: str
    detail: str


class _Client:
    """One DEALER connection with request/reply matching by ``seq`` and deadlines on every wait."""

    def __init__(
        self,
        endpoint: str,
        timeout_s: float,
        curve: Optional[CurveClientKeys],
        context: Optional[zmq.Context],
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._seq = itertools.count()
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
        if curve is not None:
            self._socket.curve_secretkey = curve.secret
            self._socket.curve_publickey = curve.public
            self._socket.curve_serverkey = curve.server_public
        self._socket.connect(endpoint)
        self.buffer_instance: Optional[str] = None  # the buffer process answering us (see `_on_restart`)
        self.buffer_restarts = 0
        self.last_reply_at = time.monotonic()

    def _send(self, message: object) -> None:
        try:
            # copy=False: pyzmq copies small frames and hands large samples to libzmq without a copy
            self._socket.send_multipart(encode_frames(message), copy=False)
        except zmq.Again:
            raise TimeoutError(
                f"could not send to trajectory buffer at {self.endpoint} within {self.timeout_s}s (send queue full)"
            ) from None

    def _receive(self, deadline: float) -> Optional[ClientReply]:
        """The next decodable message, or None once `deadline` (time.monotonic) has passed."""
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(remaining_ms, zmq.POLLIN):
                return None
            frames = self._socket.recv_multipart(copy=False)  # a batch's samples stay views into its frames
            try:
                reply = decode_client_reply(frames)
            except MessageError as exc:  # a newer buffer, or corruption: skip, but say so
                log.warning("ignoring an undecodable reply from %s: %s", self.endpoint, exc)
                continue
            self.last_reply_at = time.monotonic()
            instance = getattr(reply, "instance", "")
            if instance and instance != self.buffer_instance:
                if self.buffer_instance is not None:
                    self.buffer_restarts += 1
                    log.warning("trajectory buffer at %s restarted (%s -> %s)", self.endpoint,
                                self.buffer_instance, instance)
                    self.buffer_instance = instance
                    self._on_restart()
                self.buffer_instance = instance
            return reply

    def _on_restart(self) -> None:
        """The buffer process was replaced and kept nothing of ours; subclasses drop what waits on it."""

    def probe(self, timeout_s: Optional[float] = None) -> bool:
        """Ask for the buffer's stats just to hear from it (notices a restart); False if it did not answer."""
        saved, self.timeout_s = self.timeout_s, timeout_s or self.timeout_s
        try:
            self.stats()
            return True
        except TimeoutError:
            return False
        finally:
            self.timeout_s = saved

    def _request(self, message: object, seq: int, extra_wait_s: float = 0.0) -> ClientReply:
        """Send `message` and return the reply carrying `seq`; other messages go to `_on_unmatched`."""
        self._send(message)
        deadline = time.monotonic() + self.timeout_s + extra_wait_s
        while True:
            reply = self._receive(deadline)
            if reply is None:
                raise TimeoutError(
                    f"no reply from trajectory buffer at {self.endpoint} within "
                    f"{self.timeout_s + extra_wait_s:.1f}s to {type(message).__name__} {seq}"
                )
            if getattr(reply, "seq", None) != seq:
                self._on_unmatched(reply)
                continue
            if isinstance(reply, Ack) and not reply.accepted:
                raise BufferRejected(self.endpoint, reply)
            return reply

    def _on_unmatched(self, reply: ClientReply) -> None:
        log.debug("ignoring an unmatched reply from %s: %s", self.endpoint, type(reply).__name__)

    def stats(self) -> Stats:
        """The buffer's counters (depth per agent, drops and rejections by reason, ...)."""
        seq = next(self._seq)
        reply = self._request(StatsRequest(seq=seq), seq)
        assert isinstance(reply, Stats), reply
        return reply

    def close(self) -> None:
        """Close the socket at once (unsent messages are dropped; producers should `flush` first)."""
        self._socket.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BufferProducer(_Client):
    """Streams finished episodes to the buffer with at most `window` unacknowledged at a time.

    The window is the flow control: when the buffer is full it withholds acks, so `send_episode` waits
    for credit instead of the buffer dropping data. Refused episodes (malformed, late, ...) do not raise
    where they are noticed, since that may be inside a later call; they are logged and collected in
    `rejections` for the caller to inspect (`pop_rejections`).
    """

    def __init__(
        self,
        endpoint: str,
        producer_id: str,
        *,
        window: int = BufferConfig.window,
        timeout_s: float = BufferConfig.request_timeout_s,
        curve: Optional[CurveClientKeys] = None,
        context: Optional[zmq.Context] = None,
        heartbeat_s: Optional[float] = None,
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        super().__init__(endpoint, timeout_s, curve, context)
        self.producer_id = producer_id
        self._heartbeat = None
        if heartbeat_s is not None:
            self._heartbeat = _Heartbeat(endpoint, producer_id, heartbeat_s, curve, context)
        self.window = window
        self.rejections: list[Rejection] = []
        self.learner_versions: dict[str, int] = {}  # model -> its learner's version, as of the last grant
        self._unacked: dict[int, str] = {}  # seq -> episode_id
        self.lost_episodes = 0  # unacknowledged when the buffer restarted

    @classmethod
    def from_config(cls, config: BufferConfig, producer_id: str, **overrides) -> "BufferProducer":
        options = dict(window=config.window, timeout_s=config.request_timeout_s, curve=client_keys(config),
                       heartbeat_s=config.producer_timeout_s / 5)
        return cls(config.producer_endpoint, producer_id, **{**options, **overrides})

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        super().close()

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def send_episode(self, group_id: str, group_size: int, episode_id: str, samples: Sequence[Sample],
                     frozen_rewards: Sequence[float] = (), draw: int = -1, prompt: str = "") -> int:
        """Queue one finished episode; returns its seq. Waits (up to `timeout_s`) only for window credit.

        `frozen_rewards`: the rewards of the episode's calls that are not sent (agents no learner trains);
        they still count in its trajectory score and its group's pooled rewards. `samples` may be empty
        when only such agents spoke: the episode still completes its group. `draw`: the draw its group was
        granted (`request_admission`), and `prompt` that problem's uid; -1 for a group outside the drawing
        order.
        A TimeoutError here means the episode was *not* sent (the buffer stayed full or unreachable);
        calling again later retries it.
        """
        self._wait_for(lambda: len(self._unacked) < self.window, "window credit")
        seq = next(self._seq)
        message = EpisodeMsg(
            producer=self.producer_id, seq=seq, group_id=group_id, group_size=group_size,
            episode_id=episode_id, samples=list(samples), frozen_rewards=[float(r) for r in frozen_rewards],
            draw=draw, prompt=prompt,
        )
        self._send(message)
        self._unacked[seq] = episode_id
        return seq

    def flush(self, timeout_s: Optional[float] = None) -> None:
        """Wait until every sent episode is acknowledged (accepted or refused)."""
        self._wait_for(lambda: not self._unacked, "acknowledgement of every episode", timeout_s)

    def abandon_group(self, group_id: str, draw: int = -1) -> None:
        """Tell the buffer that `group_id` (of draw `draw`) will never complete (an episode of it was dropped), so
        it drops what arrived of the group and returns its admission slot and draw now; not answered (a lost
        message only delays that until the buffer's incomplete timeout). Later episodes of the group must not be
        sent: they are refused."""
        self._send(AbandonGroup(seq=next(self._seq), producer=self.producer_id, group_id=group_id, draw=draw))

    def request_admission(self, n_groups: int) -> list[int]:
        """Ask to start `n_groups` new groups; returns the draws of those the staleness bound allows now (one
        group each, in the run's drawing order: `drmas.core.draws`). The versions the grant was based on are
        kept in `learner_versions` (0 groups: just ask for them)."""
        seq = next(self._seq)
        reply = self._request(AdmitRequest(seq=seq, producer=self.producer_id, n_groups=n_groups), seq)
        assert isinstance(reply, AdmitReply), reply
        self.learner_versions = dict(reply.versions)
        return list(reply.draws)

    def pop_rejections(self) -> list[Rejection]:
        rejections, self.rejections = self.rejections, []
        return rejections

    def _wait_for(self, condition, what: str, timeout_s: Optional[float] = None) -> None:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while not condition():
            reply = self._receive(deadline)
            if reply is None:
                raise TimeoutError(
                    f"trajectory buffer at {self.endpoint}: no {what} within {timeout:.1f}s "
                    f"({len(self._unacked)} episodes unacknowledged)"
                )
            self._on_unmatched(reply)

    def _on_restart(self) -> None:
        """Episodes the old buffer never acknowledged are gone with it: stop waiting for their acks and
        count them (`lost_episodes`); the groups they belonged to cannot complete and are dropped as
        incomplete by the new buffer, so nothing is trained on a partial group."""
        self.lost_episodes += len(self._unacked)
        self._unacked.clear()

    def _on_unmatched(self, reply: ClientReply) -> None:
        if isinstance(reply, Acks):  # every episode the buffer stored in one round of its loop
            for seq in reply.seqs:
                self._unacked.pop(seq, None)
            return
        if not isinstance(reply, Ack):
            return super()._on_unmatched(reply)
        episode_id = self._unacked.pop(reply.seq, "?")
        if not reply.accepted:
            log.warning("trajectory buffer at %s refused episode %s: %s %s", self.endpoint, episode_id,
                        reply.reason, reply.detail)
            self.rejections.append(Rejection(reply.seq, episode_id, reply.reason, reply.detail))


class _Heartbeat:
    """Tells the buffer every `interval_s` that a producer lives, from a thread and socket of its own, so
    a rollout busy in a long generation round is not taken for dead (see `BufferConfig.producer_timeout_s`)."""

    def __init__(self, endpoint: str, producer_id: str, interval_s: float, curve: Optional[CurveClientKeys],
                 context: Optional[zmq.Context]) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval_s}")
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)  # never pile up beats for an unreachable buffer
        if curve is not None:
            self._socket.curve_secretkey = curve.secret
            self._socket.curve_publickey = curve.public
            self._socket.curve_serverkey = curve.server_public
        self._socket.connect(endpoint)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(producer_id, interval_s),
                                        name=f"heartbeat-{producer_id}", daemon=True)
        self._thread.start()

    def _run(self, producer_id: str, interval_s: float) -> None:
        seq = 0
        try:
            while True:
                try:
                    self._socket.send(encode_message(Heartbeat(seq=seq, producer=producer_id)), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # buffer unreachable right now; the next beat tries again
                seq += 1
                if self._stop.wait(interval_s):
                    return
        finally:
            self._socket.close(linger=0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class BufferConsumer(_Client):
    """A learner's handle: pull complete agent groups, report its version and its own drops."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout_s: float = BufferConfig.request_timeout_s,
        curve: Optional[CurveClientKeys] = None,
        context: Optional[zmq.Context] = None,
    ) -> None:
        super().__init__(endpoint, timeout_s, curve, context)
        self._backlog: list[AgentGroup] = []  # late answers to pulls that timed out here
        self._versions: dict[str, VersionUpdate] = {}  # model -> last version report (re-sent to a restarted buffer)
        self._resync = False
        self._invalid: list[tuple[str, str, int, str]] = []  # (agent, group_id, n_samples, reason) to report
        self._undecodable: Counter[str] = Counter()  # reason -> samples of groups dropped on opening

    @classmethod
    def from_config(cls, config: BufferConfig, **overrides) -> "BufferConsumer":
        options = dict(timeout_s=config.request_timeout_s, curve=client_keys(config))
        return cls(config.consumer_endpoint, **{**options, **overrides})

    def pull(self, agents: Sequence[str], max_groups: int = 1, wait_ms: int = 0) -> list[AgentGroup]:
        """Up to `max_groups` complete agent groups of `agents`, oldest first and fair across agents.

        Waits up to `wait_ms` for the first one, then returns possibly fewer (or none).
        """
        wanted = set(agents)
        ready: list[AgentGroup] = []
        rest: list[AgentGroup] = []
        for group in self._backlog:
            (ready if group.agent in wanted and len(ready) < max_groups else rest).append(group)
        if ready:
            self._backlog = rest
            return ready
        seq = next(self._seq)
        pull = Pull(seq=seq, agents=list(agents), max_groups=max_groups, wait_ms=wait_ms)
        reply = self._request(pull, seq, extra_wait_s=wait_ms / 1000)
        assert isinstance(reply, GroupBatchView), reply
        groups = self._open(reply)
        self._report_invalid()
        if self._resync:
            self._resync = False
            for update in list(self._versions.values()):
                self._send_version(update)
        return groups

    def report_version(self, model: str, version: int, incarnation: str = "", finished: bool = False,
                       trained: Optional[Mapping[str, DrawSet]] = None) -> None:
        """Publish this learner's policy version (admission and the stale-drop rule follow it).

        `incarnation` names this learner process (a new one makes the buffer recount the model's budget);
        `finished` says it took its last step (admission then stops waiting for it); `trained`: the draws
        each of its agents has trained (the buffer draws again what was handed out and is neither trained nor
        on its way)."""
        wire = None if trained is None else {agent: Draws(floor=draws.floor, extra=sorted(draws.extra))
                                             for agent, draws in trained.items()}
        self._send_version(VersionUpdate(seq=0, model=model, version=version, incarnation=incarnation,
                                         finished=finished, trained=wire))

    def _send_version(self, update: VersionUpdate) -> None:
        update.seq = next(self._seq)
        self._versions[update.model] = update
        self._request(update, update.seq)

    def report_drops(self, agent: str, group_ids: Sequence[str], n_samples: int, reason: str) -> None:
        """Tell the buffer this learner dropped delivered groups, so they are counted and replaced."""
        seq = next(self._seq)
        self._request(DropReport(seq=seq, agent=agent, group_ids=list(group_ids), n_samples=n_samples,
                                 reason=reason), seq)

    def _on_restart(self) -> None:
        """A restarted buffer believes every model is at version 0 (admitting too much, dropping nothing as
        stale): tell it our versions again right after the current request."""
        self._resync = True

    def _open(self, batch: GroupBatchView) -> list[AgentGroup]:
        """Decode each delivered group on its own; a group with a bad sample is set aside for reporting."""
        groups = []
        for view in batch.groups:
            try:
                groups.append(open_group(view))
            except MessageError as exc:
                log.warning("dropping group %s/%s from %s: %s", view.group_id, view.agent, self.endpoint, exc)
                self._invalid.append((view.agent, view.group_id, len(view.samples), exc.reason))
                self._undecodable[exc.reason] += len(view.samples)
        return groups

    def pop_undecodable(self) -> Counter[str]:
        """Samples of delivered groups dropped because a sample failed to decode or validate, by reason, since
        the last call (already reported to the buffer; for the caller's own metrics)."""
        counts, self._undecodable = self._undecodable, Counter()
        return counts

    def _report_invalid(self) -> None:
        while self._invalid:
            agent, group_id, n_samples, reason = self._invalid.pop()
            self.report_drops(agent, [group_id], n_samples, reason)

    def _on_unmatched(self, reply: ClientReply) -> None:
        if isinstance(reply, GroupBatchView):  # delivered to us after our pull timed out: keep, never lose
            self._backlog.extend(self._open(reply))
        else:
            super()._on_unmatched(reply)
