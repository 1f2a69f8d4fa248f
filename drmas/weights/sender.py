"""Learner side of the weight channel: push versioned weights to every rollout serving one model.

One `WeightSender` per learner (per model). Rollouts join and leave at any time; each gets its own two-rank
process group (`PairGroup`) so that nothing global is resized and a dead rollout breaks only its own pair.

Threads and who owns what:
- the **control thread** owns the ZeroMQ ROUTER: it answers Joins and heartbeats, records Ready/Ack
  messages, sends what other threads queued in the `Outbox`, and drops rollouts that fall silent;
- a short-lived **connect thread** per Join builds the learner's end of the pair group (this blocks until
  the rollout builds its end, so it must not block anything else);
- the **join-sync thread** sends the current weights (from the ``current_weights`` provider) to rollouts
  that just joined, so late joiners and restarted rollouts start on the current version;
- the caller's thread runs `push`. Pushes and join syncs never overlap: they share one transfer lock, which
  `exclusive()` also exposes to the learner (see there).

One transfer (push or join sync) to a set of rollouts:
1. a Manifest (version + layout) goes to each rollout over ZeroMQ;
2. the learner waits for each rollout's Ready: a rollout only says Ready once it has paused generation and is
   about to receive, so the collective timeout never has to cover a generation step. Rollouts that are ready
   together are served together (one pass over the data); a rollout that is not ready within
   ``ready_timeout_s`` is dropped;
3. the units of the layout are broadcast back to back over each pair, two on the wire at a time; a unit
   that needs packing is packed while the previous ones travel (two reused unit buffers);
4. each rollout acknowledges the version once its apply callback returned.
Any failure (a broadcast error or timeout, no Ready, no Ack, silence) drops that rollout only: its pair is
discarded, it is told to Rejoin, and the push carries on with the others. `push` never raises because a
rollout failed; it reports who got the version and who was dropped.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import secrets
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import torch
import torch.distributed as dist
import zmq

from drmas.netsec import CurveKeys, is_loopback_host, start_curve_authenticator
from drmas.weights import messages as msg
from drmas.weights.chunks import Layout, Packer, plan_layout
from drmas.weights.config import WeightSyncConfig
from drmas.weights.transport import WILDCARD_HOSTS, Outbox, PairError, PairGroup, resolve_backend

log = logging.getLogger(__name__)

CurrentWeights = Callable[[], tuple[int, Iterable[tuple[str, torch.Tensor]]]]
"""Returns ``(version, named_tensors)`` of the weights a newly joined rollout must receive."""

# Rollouts that become ready within this window of the first one share its pass over the data: a little
# extra pause for the first, against sending the whole model once per rollout when all poll at once.
_GATHER_S = 0.1


@dataclass
class PushReport:
    """Outcome of one transfer. ``bytes`` is the tensor data sent to each rollout (tied weights once)."""

    version: int
    seconds: float
    bytes: int
    receivers_ok: list[str]
    receivers_dropped: list[str]
    receivers_failed: list[str] = field(default_factory=list)  # received, but their apply callback raised
    errors: dict[str, str] = field(default_factory=dict)  # receiver id -> why it was dropped or failed

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(eq=False)
class _Peer:
    """The learner's view of one joined rollout (one pair)."""

    receiver_id: str
    routing_id: bytes
    pair_id: str
    last_seen: float
    ranks: int = 1  # receiving ranks the rollout brings (the group has 1 + ranks members)
    pair: PairGroup | None = None  # set once the group is built (the peer is then "connected")
    busy: bool = False  # a transfer is using the pair: only that transfer may close it
    drop_reason: str | None = None
    needs_sync: bool = False  # joined, not yet given the current weights
    ready_version: int | None = None
    ack: msg.Ack | None = None
    acked_version: int | None = None

    @property
    def connected(self) -> bool:
        return self.pair is not None and self.drop_reason is None


class _Registry:
    """The joined rollouts, their state, and the one condition variable every waiter uses."""

    def __init__(self, send: Callable[[_Peer, msg.Message], None]) -> None:
        self.cond = threading.Condition()
        self._by_id: dict[str, _Peer] = {}
        self._by_pair: dict[str, _Peer] = {}
        self._send = send

    def add(self, peer: _Peer) -> None:
        """Register a new pair; an earlier pair of the same rollout (a restart) is dropped."""
        with self.cond:
            old = self._by_id.get(peer.receiver_id)
            if old is not None:
                self.drop(old, "replaced by a new Join of the same receiver", tell=False)
            self._by_id[peer.receiver_id] = peer
            self._by_pair[peer.pair_id] = peer

    def by_pair(self, pair_id: str) -> _Peer | None:
        with self.cond:
            return self._by_pair.get(pair_id)

    def connected(self) -> list[_Peer]:
        with self.cond:
            return [p for p in self._by_id.values() if p.connected]

    def all(self) -> list[_Peer]:
        with self.cond:
            return list(self._by_id.values())

    def drop(self, peer: _Peer, reason: str, tell: bool = True) -> None:
        """Forget ``peer``; close its pair unless a transfer holds it (that transfer closes it when done).

        ``tell`` sends it a Rejoin so a live rollout re-joins at once instead of waiting for a timeout.
        """
        with self.cond:
            if peer.drop_reason is not None:
                return
            peer.drop_reason = reason
            if self._by_id.get(peer.receiver_id) is peer:
                del self._by_id[peer.receiver_id]
            self._by_pair.pop(peer.pair_id, None)
            if not peer.busy and peer.pair is not None:
                peer.pair.close()
            self.cond.notify_all()
        log.info("weights: dropped receiver %s (pair %s): %s", peer.receiver_id, peer.pair_id, reason)
        if tell:
            self._send(peer, msg.Rejoin(peer.pair_id, reason))

    def release(self, peers: Sequence[_Peer]) -> None:
        """End a transfer's hold on ``peers``; close the pairs of those dropped meanwhile."""
        with self.cond:
            for peer in peers:
                peer.busy = False
                if peer.drop_reason is not None and peer.pair is not None:
                    peer.pair.close()

    def expire(self, now: float, silence_s: float) -> None:
        """Drop connected peers not heard from for ``silence_s`` (killed, hung, or partitioned)."""
        for peer in self.connected():
            if now - peer.last_seen > silence_s:
                self.drop(peer, f"silent for {now - peer.last_seen:.1f} s")


class _Outcome:
    """Accumulates one transfer's per-rollout results."""

    def __init__(self) -> None:
        self.ok: list[str] = []
        self.dropped: list[str] = []
        self.failed: list[str] = []
        self.errors: dict[str, str] = {}

    def drop(self, peer: _Peer) -> None:
        if peer.receiver_id not in self.dropped:
            self.dropped.append(peer.receiver_id)
            self.errors[peer.receiver_id] = peer.drop_reason or "dropped"


class _Broadcaster:
    """Runs one transfer (Manifest -> Ready -> unit broadcasts -> Ack) to a set of connected peers."""

    def __init__(self, registry: _Registry, send: Callable[[_Peer, msg.Message], None], cfg: WeightSyncConfig,
                 incarnation: str = "") -> None:
        self._registry = registry
        self._send = send
        self._cfg = cfg
        self._incarnation = incarnation
        self._scratch: list[torch.Tensor] = []  # two unit buffers, kept across transfers

    def run(
        self, peers: Sequence[_Peer], version: int, named_tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> PushReport:
        start = time.monotonic()
        named = list(named_tensors)
        layout = plan_layout(named, self._cfg.chunk_bytes)
        packer = Packer(layout, [None if spec.alias_of >= 0 else t for spec, (_, t) in zip(layout.tensors, named)])
        outcome = _Outcome()
        with self._registry.cond:
            live = [p for p in peers if p.connected and not p.busy]
            for peer in live:
                peer.busy, peer.ready_version, peer.ack = True, None, None
        try:
            for peer in live:
                self._send(peer, msg.Manifest(peer.pair_id, version, layout, self._incarnation))
            remaining, delivered = live, []
            deadline = start + self._cfg.ready_timeout_s
            while remaining:
                wave, remaining = self._await_ready(remaining, version, deadline, outcome)
                if wave:
                    delivered += self._stream(wave, layout, packer, outcome)
            self._await_acks(delivered, version, outcome)
        finally:
            self._registry.release(live)
        return PushReport(
            version=version,
            seconds=time.monotonic() - start,
            bytes=layout.payload_bytes,
            receivers_ok=sorted(outcome.ok),
            receivers_dropped=sorted(outcome.dropped),
            receivers_failed=sorted(outcome.failed),
            errors=outcome.errors,
        )

    def _await_ready(
        self, waiting: list[_Peer], version: int, deadline: float, outcome: _Outcome
    ) -> tuple[list[_Peer], list[_Peer]]:
        """Split ``waiting`` into (ready now, still waiting); drop peers that vanished or missed the deadline."""
        cond = self._registry.cond
        with cond:
            first_ready: float | None = None
            while True:
                for peer in [p for p in waiting if p.drop_reason is not None]:
                    outcome.drop(peer)
                waiting = [p for p in waiting if p.drop_reason is None]
                ready = [p for p in waiting if p.ready_version == version]
                now = time.monotonic()
                if ready and first_ready is None:
                    first_ready = now
                if ready and (len(ready) == len(waiting) or now - first_ready >= _GATHER_S):
                    return ready, [p for p in waiting if p not in ready]
                if not waiting:
                    return [], []
                if now >= deadline:
                    for peer in waiting:
                        self._registry.drop(peer, f"not ready within {self._cfg.ready_timeout_s:g} s")
                        outcome.drop(peer)
                    return [], []
                wake = deadline if first_ready is None else min(deadline, first_ready + _GATHER_S)
                cond.wait(max(wake - now, 0.001))

    def _scratch_buffers(self, nbytes: int, device: torch.device) -> list[torch.Tensor]:
        if not self._scratch or self._scratch[0].numel() < nbytes or self._scratch[0].device != device:
            self._scratch = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
        return self._scratch

    def _stream(self, wave: list[_Peer], layout: Layout, packer: Packer, outcome: _Outcome) -> list[_Peer]:
        """Broadcast every unit to ``wave``; returns the peers that received all of them.

        Two units are on the wire at a time: unit i is packed into the buffer of unit i-2 (which is waited
        for first) while unit i-1 is still travelling, so the wire never idles while either side copies.
        """
        live = list(wave)
        scratch = self._scratch_buffers(layout.chunk_bytes, live[0].pair.device)
        in_flight: list[list[tuple[_Peer, dist.Work]]] = []
        sent = 0
        for index, unit in enumerate(layout.units):
            if unit.nbytes == 0:  # only empty tensors: the manifest says it all
                continue
            if len(in_flight) == 2:
                live = self._finish(in_flight.pop(0), outcome, live)
            data = packer.unit_bytes(index, scratch[sent % 2])
            sent += 1
            works = []
            for peer in live:
                try:
                    works.append((peer, peer.pair.broadcast(data)))
                except PairError as error:
                    self._fail(peer, error, outcome)
            live = [peer for peer, _ in works]
            in_flight.append(works)
            if not live:
                break
        for works in in_flight:
            live = self._finish(works, outcome, live)
        return live

    def _finish(self, works: list[tuple[_Peer, dist.Work]], outcome: _Outcome, live: list[_Peer]) -> list[_Peer]:
        """Wait for one unit on every peer it was sent to; returns ``live`` minus the peers it failed on."""
        for peer, work in works:
            if peer not in live:
                continue  # already failed on an earlier unit
            try:
                peer.pair.wait(work)
            except PairError as error:
                self._fail(peer, error, outcome)
                live = [p for p in live if p is not peer]
        return live

    def _fail(self, peer: _Peer, error: Exception, outcome: _Outcome) -> None:
        self._registry.drop(peer, f"broadcast failed: {error}")
        outcome.drop(peer)

    def _await_acks(self, peers: list[_Peer], version: int, outcome: _Outcome) -> None:
        deadline = time.monotonic() + self._cfg.timeout_s
        cond = self._registry.cond
        with cond:
            waiting = list(peers)
            while waiting:
                for peer in list(waiting):
                    if peer.drop_reason is not None:
                        outcome.drop(peer)
                    elif peer.ack is not None and peer.ack.version == version:
                        if peer.ack.ok:
                            outcome.ok.append(peer.receiver_id)
                            peer.acked_version = version
                        else:
                            outcome.failed.append(peer.receiver_id)
                            outcome.errors[peer.receiver_id] = f"apply failed: {peer.ack.error}"
                    else:
                        continue
                    waiting.remove(peer)
                left = deadline - time.monotonic()
                if not waiting:
                    return
                if left <= 0:
                    for peer in waiting:
                        self._registry.drop(peer, f"no acknowledgement within {self._cfg.timeout_s:g} s")
                        outcome.drop(peer)
                    return
                cond.wait(left)


class _ControlLoop(threading.Thread):
    """Owns the ROUTER socket: Joins, heartbeats, Ready/Ack bookkeeping, queued sends, silence expiry."""

    def __init__(
        self,
        router: zmq.Socket,
        outbox: Outbox,
        registry: _Registry,
        handle: Callable[[bytes, msg.Message], None],
        cfg: WeightSyncConfig,
    ) -> None:
        super().__init__(name="drmas-weights-control", daemon=True)
        self._router = router
        self._outbox = outbox
        self._registry = registry
        self._handle = handle
        self._cfg = cfg
        self.stopping = threading.Event()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._outbox.wakeup, zmq.POLLIN)
        cfg = self._cfg
        tick_ms = max(10, int(cfg.heartbeat_s * 500))
        while not self.stopping.is_set():
            events = dict(poller.poll(tick_ms))
            if self._router in events:
                self._receive_all()
            self._send_queued()
            self._registry.expire(time.monotonic(), cfg.peer_timeout_s)
        self._send_queued()  # the Rejoins of close(): give them a moment to leave before the socket goes
        self._router.close(linger=500)

    def _receive_all(self) -> None:
        while True:
            try:
                routing_id, payload = self._router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except ValueError:  # not a two-frame message: not ours
                continue
            try:
                message = msg.decode(payload)
            except ValueError as error:
                log.warning("weights: ignoring an undecodable control message: %s", error)
                continue
            self._handle(routing_id, message)

    def _send_queued(self) -> None:
        for routing_id, payload, peer in self._outbox.drain():
            try:
                self._router.send_multipart([routing_id, payload], zmq.NOBLOCK)
            except zmq.ZMQError as error:  # EHOSTUNREACH (ROUTER_MANDATORY): it disconnected; Again: not reading
                if peer is not None and peer.drop_reason is None:
                    self._registry.drop(peer, f"control socket unreachable ({error})", tell=False)


class _JoinSync(threading.Thread):
    """Gives the current weights to rollouts that just connected (late joiners and restarted rollouts)."""

    def __init__(
        self, registry: _Registry, broadcaster: _Broadcaster, provider: CurrentWeights, transfer_lock: threading.RLock
    ) -> None:
        super().__init__(name="drmas-weights-join-sync", daemon=True)
        self._registry = registry
        self._broadcaster = broadcaster
        self._provider = provider
        self._transfer_lock = transfer_lock
        self.stopping = threading.Event()

    def _newcomers(self) -> list[_Peer]:
        return [p for p in self._registry.connected() if p.needs_sync]

    def run(self) -> None:
        cond = self._registry.cond
        while not self.stopping.is_set():
            with cond:
                cond.wait_for(lambda: self.stopping.is_set() or bool(self._newcomers()), timeout=0.5)
            if self.stopping.is_set():
                return
            with self._transfer_lock:
                peers = self._newcomers()  # a push may have served them while we waited for the lock
                if not peers or self.stopping.is_set():
                    continue
                with cond:
                    for peer in peers:
                        peer.needs_sync = False
                try:
                    version, named = self._provider()
                    report = self._broadcaster.run(peers, version, named)
                except Exception:  # a faulty provider must not kill the thread; the rollout gets the next push
                    log.exception("weights: join sync failed")
                    continue
            log.info(
                "weights: join sync of version %d to %s in %.2f s (dropped: %s)",
                report.version, report.receivers_ok, report.seconds, report.receivers_dropped,
            )


class WeightSender:
    """Pushes versioned weights from a learner to the rollouts of one model (see the module docstring).

    Rollouts connect to `endpoint`. ``current_weights`` (optional) returns ``(version, named_tensors)`` for a
    rollout that just joined; without it a new rollout waits for the next `push`. The provider runs on the
    join-sync thread while holding `exclusive()`, so it may return live parameters as long as the learner
    changes them in place only inside `exclusive()` (or returns copies).
    """

    def __init__(
        self,
        bind_host: str,
        control_port: int = 0,
        store_port: int = 0,
        chunk_mb: float = 32.0,
        timeout_s: float = 30.0,
        backend: str = "auto",
        *,
        model: str = "",
        incarnation: str = "",
        current_weights: CurrentWeights | None = None,
        config: WeightSyncConfig | None = None,
        curve: CurveKeys | None = None,
        device: torch.device | None = None,
    ) -> None:
        """``config`` (if given) supplies every setting; otherwise the keyword settings are used with the
        defaults of `WeightSyncConfig` for the rest. ``model`` '' accepts rollouts of any model. ``incarnation``
        goes with every version sent (see `Manifest`), and rollouts stamp it on what they generate.

        ``curve``: the cluster's CURVE server keys and the client keys allowed in (the buffer's). With it,
        only those rollouts can join, and everything they learn about the rendezvous (store port, pair id)
        travels encrypted; pair ids then carry 128 random bits, so nobody can guess their way into a pair's
        gloo/NCCL rendezvous on the (unauthenticated) TCPStore. Binding a non-loopback address needs it.

        ``device``: where the tensors to send live; backend 'auto' takes NCCL only for CUDA tensors."""
        if curve is None and not is_loopback_host(bind_host):
            raise ValueError(
                f"refusing to serve weights on {bind_host!r} without CURVE keys: anyone on the network could "
                "join the weight-sync group. Bind 127.0.0.1 or configure the pipeline.buffer.curve_* key files."
            )
        self._curve = curve
        self._auth = None
        self.config = config or WeightSyncConfig(chunk_mb=chunk_mb, timeout_s=timeout_s, backend=backend)
        self.backend = resolve_backend(self.config.backend, device)
        self.model = model
        self.bind_host = bind_host
        self._control_port = control_port
        self._store_port = store_port
        self._provider = current_weights
        # stamped on every version sent; pair ids carry it too, so they never collide with a previous learner's
        self._incarnation = incarnation or uuid.uuid4().hex[:8]
        self._pair_counter = itertools.count()
        self._transfer_lock = threading.RLock()
        self._registry = _Registry(self._send)
        self._broadcaster = _Broadcaster(self._registry, self._send, self.config, self._incarnation)
        self._context: zmq.Context | None = None
        self._outbox: Outbox | None = None
        self._control: _ControlLoop | None = None
        self._join_sync: _JoinSync | None = None
        self._store: dist.TCPStore | None = None
        self._connecting: set[threading.Thread] = set()
        self.version: int | None = None
        self.endpoint = ""
        self.store_port = 0

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> WeightSender:
        """Bind the control socket and the TCPStore, start the threads; returns self."""
        timeout = self.config.timeout_s
        self._store = dist.TCPStore(
            self.bind_host if self.bind_host not in WILDCARD_HOSTS else "0.0.0.0",
            self._store_port,
            None,
            True,
            datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        self.store_port = self._store.port
        self._context = zmq.Context()
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._auth = start_curve_authenticator(self._context, self._curve.allowed_clients)
            router.curve_server = True
            router.curve_publickey = self._curve.public
            router.curve_secretkey = self._curve.secret
        host = "*" if self.bind_host in WILDCARD_HOSTS else self.bind_host
        router.bind(f"tcp://{host}:{self._control_port or '*'}")
        port = int(router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        public = self.bind_host if self.bind_host not in WILDCARD_HOSTS else socket.gethostname()
        self.endpoint = f"tcp://{public}:{port}"
        self._outbox = Outbox(self._context)
        self._control = _ControlLoop(router, self._outbox, self._registry, self._handle, self.config)
        self._control.start()
        if self._provider is not None:
            self._join_sync = _JoinSync(self._registry, self._broadcaster, self._provider, self._transfer_lock)
            self._join_sync.start()
        log.info("weights: sender for model %r on %s (store port %d, %s)",
                 self.model, self.endpoint, self.store_port, self.backend)
        return self

    def close(self) -> None:
        """Tell every rollout to re-join (a successor may come up on the same ports), then release everything."""
        if self._control is None:
            return
        if self._join_sync is not None:
            self._join_sync.stopping.set()
            with self._registry.cond:
                self._registry.cond.notify_all()
            self._join_sync.join(timeout=self.config.timeout_s)
        with self._transfer_lock:
            for peer in self._registry.all():
                self._registry.drop(peer, "learner shutting down")
            self._control.stopping.set()
            self._control.join(timeout=5)
        for thread in list(self._connecting):  # they hold the store: a successor may want its port
            thread.join(timeout=self.config.timeout_s)
        self._control = None
        self._outbox.close()
        if self._auth is not None:
            self._auth.stop()
        self._context.term()
        self._store = None

    def __enter__(self) -> WeightSender:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ public API

    def push(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> PushReport:
        """Send ``named_tensors`` as ``version`` to every connected rollout and wait until each has it.

        Blocks for the transfer (and for rollouts to reach a step boundary, at most ``ready_timeout_s``).
        Never raises because of a rollout: failures are in the report. The tensors must not change until
        push returns (large tensors are broadcast straight from their memory).
        """
        with self._transfer_lock:
            peers = self._registry.connected()
            report = self._broadcaster.run(peers, version, named_tensors)
            with self._registry.cond:
                for peer in peers:
                    if peer.receiver_id in report.receivers_ok:
                        peer.needs_sync = False
            self.version = version
        log.info(
            "weights: pushed version %d (%.1f MB) in %.2f s to %s; dropped %s",
            version, report.bytes / 1e6, report.seconds, report.receivers_ok, report.receivers_dropped,
        )
        return report

    def receivers(self) -> dict[str, int | None]:
        """Connected rollouts -> the last version each acknowledged (None before its first)."""
        return {p.receiver_id: p.acked_version for p in self._registry.connected()}

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold off transfers: wrap in-place weight updates (the optimizer step) in it when the
        ``current_weights`` provider returns live parameters, so a join sync never sends half-updated weights.
        Re-entrant: `push` may be called inside."""
        with self._transfer_lock:
            yield

    # ------------------------------------------------------------------------------------------ control

    def _send(self, peer: _Peer, message: msg.Message) -> None:
        if self._outbox is not None:
            self._outbox.put((peer.routing_id, msg.encode(message), peer))

    def _reply(self, routing_id: bytes, message: msg.Message) -> None:
        if self._outbox is not None:
            self._outbox.put((routing_id, msg.encode(message), None))

    def _handle(self, routing_id: bytes, message: msg.Message) -> None:
        """React to one control message (control thread)."""
        if isinstance(message, msg.Join):
            self._on_join(routing_id, message)
            return
        pair_id = getattr(message, "pair_id", None)
        peer = self._registry.by_pair(pair_id) if pair_id is not None else None
        if peer is None:
            if isinstance(message, msg.Heartbeat):
                self._reply(routing_id, msg.Rejoin(message.pair_id, "unknown pair (learner restarted?)"))
            return  # a late message for a pair that is gone
        with self._registry.cond:
            peer.last_seen = time.monotonic()
            if isinstance(message, msg.Ready):
                peer.ready_version = message.version
            elif isinstance(message, msg.Ack):
                peer.ack = message
            self._registry.cond.notify_all()
        if isinstance(message, msg.Heartbeat):
            self._reply(routing_id, msg.HeartbeatReply(message.pair_id))
        elif isinstance(message, msg.Leave):
            self._registry.drop(peer, "left", tell=False)

    def _on_join(self, routing_id: bytes, join: msg.Join) -> None:
        if join.protocol != msg.PROTOCOL_VERSION:
            self._reply(routing_id, msg.Refuse(join.nonce, f"protocol {join.protocol} != {msg.PROTOCOL_VERSION}"))
            return
        if self.model and join.model and join.model != self.model:
            self._reply(routing_id, msg.Refuse(join.nonce, f"this learner serves {self.model!r}, not {join.model!r}"))
            return
        if not 1 <= join.ranks <= msg.MAX_RANKS:
            self._reply(routing_id, msg.Refuse(join.nonce, f"ranks must be 1..{msg.MAX_RANKS}, got {join.ranks}"))
            return
        pair_id = f"{self._incarnation}-{next(self._pair_counter)}"
        if self._curve is not None:
            pair_id += f"-{secrets.token_hex(16)}"  # unguessable store keys (see __init__)
        peer = _Peer(join.receiver_id, routing_id, pair_id, last_seen=time.monotonic(), ranks=join.ranks)
        self._registry.add(peer)
        cfg = self.config
        store_host = self.bind_host if self.bind_host not in WILDCARD_HOSTS else ""
        self._send(peer, msg.Welcome(
            join.nonce, pair_id, store_host, self.store_port, self.backend,
            cfg.timeout_s, cfg.heartbeat_s, cfg.peer_timeout_s,
        ))
        thread = threading.Thread(target=self._connect, args=(peer,), name=f"drmas-weights-pair-{pair_id}", daemon=True)
        self._connecting.add(thread)
        thread.start()

    def _connect(self, peer: _Peer) -> None:
        """Build the learner's end of ``peer``'s pair group (connect thread)."""
        local = self.bind_host if self.bind_host not in WILDCARD_HOSTS else ""
        try:
            pair = PairGroup.connect(self._store, peer.pair_id, 0, self.backend, self.config.timeout_s, local,
                                     world_size=1 + peer.ranks)
        except PairError as error:
            self._registry.drop(peer, str(error))
            return
        finally:
            self._connecting.discard(threading.current_thread())
        with self._registry.cond:
            if peer.drop_reason is not None:
                pair.close()
                return
            peer.pair = pair
            peer.last_seen = time.monotonic()
            peer.needs_sync = self._provider is not None
            self._registry.cond.notify_all()
        log.info("weights: receiver %s connected (pair %s)", peer.receiver_id, peer.pair_id)

    @classmethod
    def from_config(cls, config: WeightSyncConfig, bind_host: str, control_port: int = 0, store_port: int = 0,
                    **kwargs) -> WeightSender:  # pass curve= the buffer's server keys when CURVE is on
        return cls(bind_host, control_port, store_port, config=config, **kwargs)
