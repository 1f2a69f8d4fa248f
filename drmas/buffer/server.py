"""`TrajectoryBuffer`: the ZeroMQ server between rollout processes and learners.

Sockets. Two ROUTER sockets, one per side: producers (`EpisodeMsg`, `AdmitRequest`) and learners
(`Pull`, `VersionUpdate`, `DropReport`); both accept `StatsRequest`. Separate sockets keep a flood of
episodes from delaying a learner's pull (the loop serves learners first, since every pull frees space)
and let each side have its own endpoint. A message of the other side's kind is refused as
``unexpected_message``.

Flow control by credit, never by dropping. Every episode is acknowledged, and a producer keeps at most
`window` episodes unacknowledged. While the buffer holds `capacity_samples` or more, the ack of an
episode that *opens a new group* is parked until learners drain space; episodes of groups already
started are still acknowledged, so a started group can always complete (otherwise a full buffer of
half-finished groups would deadlock, with learners unable to drain anything). Held samples therefore
exceed the capacity by at most the producers' in-flight windows plus the rest of groups already started.

Delivery is at most once per agent group: groups leave the buffer when sent; a send to a learner that
has disconnected fails (ROUTER_MANDATORY) and the groups go back to the head of their queues.

Threading: the poll loop runs either in the caller (`serve_forever`, for a process; `stop()` from a
signal handler ends it) or in a thread (`start`/`stop`, for tests and colocated use). `stats()` and
`discard()` are safe from any thread.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Union

import msgspec
import zmq
import zmq.auth.thread

from drmas.buffer.admission import AdmissionController
from drmas.buffer.config import BufferConfig, CurveKeys, is_local_endpoint, start_curve_authenticator
from drmas.buffer.messages import (
    REJECT_UNEXPECTED,
    Ack,
    AdmitReply,
    AdmitRequest,
    AgentGroupView,
    DropReport,
    EpisodeView,
    GroupBatchView,
    MessageError,
    Pull,
    SampleHeader,
    Stats,
    StatsRequest,
    Heartbeat,
    VersionUpdate,
    decode_buffer_request,
    encode_message,
    recover_seq,
    validated_samples,
)
from drmas.buffer.store import EpisodeRefused, GroupStore, QueuedGroup, StoredSample
from drmas.protocol import Sample

log = logging.getLogger(__name__)

REJECT_FRAMING = "bad_framing"
REJECT_UNKNOWN_AGENT = "unknown_agent"
REJECT_MODEL_MISMATCH = "model_mismatch"
REJECT_UNKNOWN_MODEL = "unknown_model"
REJECT_INTERNAL = "internal_error"

_TICK_S = 0.05  # longest poll: bounds the latency of stop(), timeouts and external discards
_MAX_BATCH = 32  # messages read from one socket before serving the other (keeps pulls prompt)
_HARD_SIZE_FACTOR = 4  # libzmq disconnects peers sending more than this many max_message_bytes


class InsecureEndpointError(ValueError):
    """Raised when the buffer would listen beyond this machine without CURVE authentication."""


@dataclass
class _ParkedAck:
    identity: bytes
    seq: int
    n_samples: int


@dataclass
class _ParkedPull:
    identity: bytes
    request: Pull
    deadline: float


class TrajectoryBuffer:
    """Per-agent queues of complete GRPO groups behind two ZeroMQ ROUTER sockets.

    Args:
        config: endpoints, capacity, limits and timeouts.
        agent_models: agent name -> model id. With it, samples of unknown agents (or served by the
            wrong model) are refused and admission knows which models a group feeds.
        groups_per_step: model id -> groups one learner update consumes (needed with `max_staleness`).
        max_staleness: bound on version lag enforced at admission and at delivery (None: unbounded).
        curve: CURVE keys; default: read from the config's key files, or none.
        clock: monotonic time source (injectable for tests).
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
    ) -> None:
        config.validate()
        self.config = config
        self._curve = curve if curve is not None else config.server_curve()
        for endpoint in (config.producer_endpoint, config.consumer_endpoint):
            if self._curve is None and not is_local_endpoint(endpoint):
                raise InsecureEndpointError(
                    f"refusing to bind {endpoint} without CURVE: anyone on the network could inject training "
                    "data. Bind 127.0.0.1 or configure buffer.curve_server_secret_file and "
                    "buffer.curve_authorized_keys_dir."
                )
        self._agent_models = dict(agent_models or {})
        self._clock = clock
        # Stamped on every reply: clients that see it change know this buffer restarted and forgot what
        # they had sent before (unacknowledged episodes, reported versions) and recover instead of waiting.
        self.instance = uuid.uuid4().hex[:12]
        self._store = GroupStore()
        self._admission = AdmissionController(
            self._agent_models, groups_per_step or {}, max_staleness, config.max_running_groups, config.lease_timeout_s
        )
        self._rejected: Counter[str] = Counter()
        self._reported_drops: Counter[str] = Counter()
        self._parked_acks: deque[_ParkedAck] = deque()
        self._producer_seen: dict[str, float] = {}  # producer id -> when it last sent anything
        self._parked_pulls: list[_ParkedPull] = []
        self._new_groups = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._loop_ident: Optional[int] = None  # thread running serve_forever, if any
        self._loop_done = threading.Event()
        self._close_lock = threading.Lock()
        self._closed = False
        self._context = zmq.Context()
        self._auth: Optional[zmq.auth.thread.ThreadAuthenticator] = None
        try:
            self._start_auth()
            self._producers = self._bind(config.producer_endpoint)
            self._consumers = self._bind(config.consumer_endpoint)
        except BaseException:
            self._release_sockets()
            raise
        self._poller = zmq.Poller()
        self._poller.register(self._consumers, zmq.POLLIN)
        self._poller.register(self._producers, zmq.POLLIN)

    # ---- setup ------------------------------------------------------------------------------------

    def _start_auth(self) -> None:
        if self._curve is None:
            return
        self._auth = start_curve_authenticator(self._context, self._curve.allowed_clients)

    def _bind(self, endpoint: str) -> zmq.Socket:
        sock = self._context.socket(zmq.ROUTER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes * _HARD_SIZE_FACTOR)
            if self._curve is not None:
                sock.curve_server = True
                sock.curve_publickey = self._curve.public
                sock.curve_secretkey = self._curve.secret
            if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
                endpoint = endpoint[:-2] + ":*"
            sock.bind(endpoint)
        except BaseException:
            sock.close(linger=0)  # an open socket would make the context's term() in cleanup wait forever
            raise
        return sock

    @property
    def producer_endpoint(self) -> str:
        """The producer endpoint actually bound (a requested port 0 resolved)."""
        return self._producers.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def consumer_endpoint(self) -> str:
        """The learner endpoint actually bound (a requested port 0 resolved)."""
        return self._consumers.getsockopt_string(zmq.LAST_ENDPOINT)

    # ---- lifecycle --------------------------------------------------------------------------------

    def start(self) -> "TrajectoryBuffer":
        """Serve in a background thread (tests, colocated runs); `stop()` ends it."""
        if self._thread is not None:
            raise RuntimeError("buffer already started")
        self._thread = threading.Thread(target=self.serve_forever, name="drmas-buffer", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the loop and release sockets and context; the counters stay readable via `stats()`.

        Safe from any thread and from a signal handler running inside `serve_forever` (then it only asks
        the loop to end; the loop releases everything on its way out).
        """
        self._stop.set()
        if self._loop_ident == threading.get_ident():
            return
        if self._loop_ident is not None and not self._loop_done.wait(timeout_s):
            raise RuntimeError(f"buffer loop did not stop within {timeout_s}s")
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        self._release_sockets()

    close = stop

    def __enter__(self) -> "TrajectoryBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _release_sockets(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            for name in ("_producers", "_consumers"):
                sock = getattr(self, name, None)
                if sock is not None:
                    sock.close(linger=0)
            if self._auth is not None:
                self._auth.stop()
            self._context.term()

    def serve_forever(self) -> None:
        """Run the poll loop until `stop()`, then release the sockets; one bad message never ends it."""
        if self._closed:
            raise RuntimeError("buffer already stopped")
        self._loop_ident = threading.get_ident()
        try:
            while not self._stop.is_set():
                events = dict(self._poller.poll(self._poll_timeout_ms()))
                with self._lock:
                    if self._consumers in events:
                        self._drain(self._consumers, self._handle_consumer)
                    if self._producers in events:
                        self._drain(self._producers, self._handle_producer)
                    self._housekeeping(self._clock())
        finally:
            self._loop_ident = None
            self._release_sockets()
            self._loop_done.set()

    def _poll_timeout_ms(self) -> int:
        timeout = _TICK_S
        if self._parked_pulls:
            timeout = min(timeout, min(p.deadline for p in self._parked_pulls) - self._clock())
        return max(0, math.ceil(timeout * 1000))

    def _drain(self, sock: zmq.Socket, handler: Callable[[bytes, object], None]) -> None:
        for _ in range(_MAX_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._handle_frames(sock, frames, handler)

    def _handle_frames(self, sock: zmq.Socket, frames: list[bytes], handler: Callable[[bytes, object], None]) -> None:
        """Decode one message and dispatch it; every failure is counted and answered, never raised."""
        identity = frames[0]
        seq = -1
        try:
            if len(frames) != 2:
                raise MessageError(REJECT_FRAMING, f"expected 1 payload frame, got {len(frames) - 1}")
            message = decode_buffer_request(frames[1], self.config.max_message_bytes)
            seq = message.seq
            handler(identity, message)
        except (MessageError, EpisodeRefused) as exc:
            if seq == -1 and len(frames) == 2:
                seq = recover_seq(frames[1])
            self._refuse(sock, identity, seq, exc.reason, exc.detail)
        except Exception as exc:  # a bug must cost one message, not the buffer
            log.exception("buffer: internal error while handling a message")
            self._refuse(sock, identity, seq, REJECT_INTERNAL, repr(exc))

    def _refuse(self, sock: zmq.Socket, identity: bytes, seq: int, reason: str, detail: str) -> None:
        self._rejected[reason] += 1
        log.debug("buffer: refused message seq=%s: %s %s", seq, reason, detail)
        self._send(sock, identity, Ack(seq=seq, accepted=False, reason=reason, detail=detail[:500]))

    def _send(self, sock: zmq.Socket, identity: bytes, message: object) -> bool:
        """Send without blocking; False when the peer is gone or not reading (the caller recovers)."""
        message.instance = self.instance  # type: ignore[attr-defined]
        try:
            sock.send_multipart([identity, encode_message(message)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH (ROUTER_MANDATORY) or EAGAIN
            log.debug("buffer: could not send to a peer: %s", exc)
            return False

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
            if groups or leases:
                log.warning("buffer: producer %s silent for %.0f s: dropped %d unfinished groups (%d samples), "
                            "released %d admitted groups", producer, timeout, len(groups),
                            sum(g.n_samples for g in groups), leases)

    def _handle_producer(self, identity: bytes, message: object) -> None:
        producer = getattr(message, "producer", None)
        if producer is not None:
            self._producer_seen[producer] = self._clock()
        if isinstance(message, Heartbeat):
            return
        if isinstance(message, EpisodeView):
            self._on_episode(identity, message)
        elif isinstance(message, AdmitRequest):
            granted = self._admission.grant(message.producer, message.n_groups, self._clock())
            reply = AdmitReply(seq=message.seq, granted=granted, versions=dict(self._admission.versions))
            self._send(self._producers, identity, reply)
        elif isinstance(message, StatsRequest):
            self._send(self._producers, identity, self._snapshot(message.seq))
        else:
            raise MessageError(REJECT_UNEXPECTED, f"{type(message).__name__} belongs on the learner endpoint")

    def _on_episode(self, identity: bytes, episode: EpisodeView) -> None:
        pairs = validated_samples(episode, self.config.validate_samples)
        samples = [self._stored(sample, raw) for sample, raw in pairs]
        score = sum(sample.reward for sample, _ in pairs) / len(pairs)  # the episode's trajectory score
        opens_group = not self._store.is_pending(episode.group_id)
        full = self._store.held_samples >= self.config.capacity_samples
        completed = self._store.add_episode(
            episode.producer, episode.group_id, episode.group_size, episode.episode_id, samples, score,
            self._clock(), claim_lease=lambda: self._admission.claim(episode.producer),
        )
        if completed is not None:
            self._admission.on_complete(completed.models, completed.leased)
            self._new_groups = True
        if opens_group and full:
            self._parked_acks.append(_ParkedAck(identity, episode.seq, len(samples)))
        else:
            self._send(self._producers, identity, Ack(seq=episode.seq, accepted=True))

    def _stored(self, sample: Union[Sample, SampleHeader], raw: msgspec.Raw) -> StoredSample:
        """Check a sample against the agent -> model map and keep its routing fields."""
        expected = self._agent_models.get(sample.agent)
        if self._agent_models and expected is None:
            raise MessageError(REJECT_UNKNOWN_AGENT, f"{sample.agent!r} is not one of {sorted(self._agent_models)}")
        if expected is not None and sample.model != expected:
            raise MessageError(REJECT_MODEL_MISMATCH, f"{sample.agent!r} is served by {expected!r}, not {sample.model!r}")
        return StoredSample(sample.agent, sample.model, sample.policy_version, raw)

    # ---- learner side -----------------------------------------------------------------------------

    def _handle_consumer(self, identity: bytes, message: object) -> None:
        if isinstance(message, Pull):
            self._on_pull(identity, message)
        elif isinstance(message, VersionUpdate):
            if self._agent_models and not self._admission.knows_model(message.model):
                raise MessageError(REJECT_UNKNOWN_MODEL, f"model {message.model!r} serves none of the agents")
            self._admission.update_version(message.model, message.version)
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
        if not taken and not (allow_empty or pull.wait_ms == 0):
            return False
        batch = GroupBatchView(seq=pull.seq, groups=[self._view(g) for g in taken])
        if self._send(self._consumers, identity, batch):
            self._store.mark_delivered(taken)
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
        )

    def _on_drop_report(self, report: DropReport) -> None:
        """Learner-side drops were already delivered: count them apart and give their budget back."""
        self._reported_drops[report.reason] += report.n_samples
        model = self._agent_models.get(report.agent)
        if model is not None:
            for group_id in report.group_ids:
                self._admission.on_dropped(group_id, model)

    # ---- timers and parked requests ---------------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        for group in self._store.expire_incomplete(now, self.config.incomplete_timeout_s):
            log.warning("buffer: discarded incomplete group %s of %s (%d samples)", group.group_id, group.producer,
                        group.n_samples)
            self._admission.on_abandoned(group.leased)
        self._admission.expire(now)
        self._release_silent_producers(now)
        self._serve_parked_pulls(now)
        self._release_parked_acks()

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

    def _release_parked_acks(self) -> None:
        """Hand credit back while space is free; each released ack lets its producer send about as much again."""
        budget = self.config.capacity_samples - self._store.held_samples
        while self._parked_acks and budget > 0:
            parked = self._parked_acks.popleft()
            budget -= parked.n_samples
            self._send(self._producers, parked.identity, Ack(seq=parked.seq, accepted=True))

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
            return len(dropped)

    def discard_stale(self) -> int:
        """Apply the staleness rule to every queue now rather than at delivery; returns groups dropped."""
        with self._lock:
            agents = list(self._store.depth())
        return sum(self.discard(agent, lambda g: self._stale_reason(g) is not None, "stale") for agent in agents)

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
            parked_acks=len(self._parked_acks),
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
        )
