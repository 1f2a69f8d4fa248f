"""Learner side of the weight channel: push versioned weights to every rollout serving one model.

One `WeightSender` per learner (per model). Rollouts join and leave at any time; each gets its own two-rank
process group (`PairGroup`) so that nothing global is resized and a dead rollout breaks only its own pair.
A push reaches the rollouts through a relay chain over hop groups between them (``relay.py``), so the
learner sends each byte once whatever their number. The pieces: ``registry.py`` (the joined rollouts),
``control.py`` (the ROUTER thread), ``transfer.py`` (one transfer, and the join-sync thread), this module
(the public `WeightSender`: lifecycle, Joins, pair building).

Threads and who owns what:
- the **control thread** owns the ZeroMQ ROUTER: it answers Joins and heartbeats, records Ready/Applied
  messages, sends what other threads queued in the `Outbox`, and drops rollouts that fall silent;
- a short-lived **connect thread** per Join builds the learner's end of the pair group (this blocks until
  the rollout builds its end, so it must not block anything else);
- the **join-sync thread** sends the current weights (from the ``current_weights`` provider) to rollouts
  that just joined, so late joiners and restarted rollouts start on the current version. A learner whose
  weights are gathered from sharded ranks cannot read them from a second thread (the gather is a
  collective and would interleave with its training collectives): it starts the sender with
  ``joins_in_thread=False`` and calls `serve_joins` from its own thread between steps, and a push serves
  every rollout still waiting for a join sync too;
- the caller's thread runs `push`. Pushes and join syncs never overlap: they share one transfer lock, which
  `exclusive()` also exposes to the learner (see there).

One transfer (push or join sync) to a set of rollouts:
1. a Manifest (version + layout) goes to each rollout over ZeroMQ;
2. the learner waits for each rollout's Ready: a rollout only says Ready once it has paused generation and is
   about to receive, so the collective timeout never has to cover a generation step. Rollouts that are ready
   together are served together (one pass over the data, down one relay chain); a rollout that is not ready
   within ``ready_timeout_s`` is dropped;
3. each rollout of the wave gets its Route (predecessor and successor in the chain); the units of the layout
   are broadcast back to back over the pair of the chain's head (and of rollouts that only take them over
   their pair), two on the wire at a time; a unit that needs packing is packed while the previous ones
   travel (two reused unit buffers); every rollout passes each unit on to its successor;
4. each rollout acknowledges the version once its apply callback returned.
Any failure (a broadcast error or timeout, no Ready, no Applied, silence) drops that rollout only: its pair is
discarded, it is told to Rejoin, and the push carries on with the others; rollouts behind it in the chain
get the version again in a new chain within the same push. `push` never raises because a rollout failed;
it reports who got the version and who was dropped.
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
from typing import Iterator

import torch
import torch.distributed as dist
import zmq

from drmas.config.weights import WeightSyncConfig
from drmas.runtime.netsec import CurveKeys, is_loopback_host, start_curve_authenticator
from drmas.weights import messages as msg
from drmas.weights.learner.control import ControlLoop
from drmas.weights.learner.peers import Peer, PeerTable
from drmas.weights.learner.source import Weights
from drmas.weights.learner.transfer import CurrentWeights, JoinSync, PushReport, Transfer, sync_newcomers
from drmas.weights.transport import (
    WILDCARD_HOSTS,
    Outbox,
    PairError,
    PairGroup,
    resolve_backend,
)

log = logging.getLogger(__name__)

__all__ = ["CurrentWeights", "PushReport", "WeightSender"]


class WeightSender:
    """Pushes versioned weights from a learner to the rollouts of one model (see the module docstring).

    Rollouts connect to `endpoint`. ``current_weights`` (optional) returns ``(version, weights)`` (a
    `WeightSource` or named tensors) for a rollout that just joined; without it a new rollout waits for the
    next `push`. The provider runs while holding `exclusive()` (on the join-sync thread, or with
    ``joins_in_thread=False`` on the thread that calls `serve_joins`), so it may return live parameters as
    long as the learner changes them in place only inside `exclusive()` (or returns copies).
    """

    def __init__(
        self,
        bind_host: str,
        control_port: int = 0,
        store_port: int = 0,
        *,
        model: str = "",
        incarnation: str = "",
        current_weights: CurrentWeights | None = None,
        config: WeightSyncConfig | None = None,
        curve: CurveKeys | None = None,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
        joins_in_thread: bool = True,
    ) -> None:
        """``config``: every setting of the channel (the defaults of `WeightSyncConfig` when None). ``model`` '' accepts rollouts of any model. ``incarnation``
        goes with every version sent (see `Manifest`), and rollouts stamp it on what they generate.

        ``curve``: the cluster's CURVE server keys and the client keys allowed in (the buffer's). With it,
        only those rollouts can join, and everything they learn about the rendezvous (store port, pair id)
        travels encrypted; pair ids then carry 128 random bits, so nobody can guess their way into a pair's
        gloo/NCCL rendezvous on the (unauthenticated) TCPStore. Binding a non-loopback address needs it.

        ``device``: where the tensors to send live; backend 'auto' takes NCCL only for CUDA tensors, and
        NCCL pairs are built on this device. ``dtype``: the dtype floating-point tensors travel in, the
        engines' (the model's compute dtype, see `drmas.models.devices`); None sends them as they are.

        ``joins_in_thread``: serve join syncs from a thread of the sender (default), or only when the owner
        calls `serve_joins` (weights that must be read on the owner's thread, see ``source.py``)."""
        if curve is None and not is_loopback_host(bind_host):
            raise ValueError(
                f"refusing to serve weights on {bind_host!r} without CURVE keys: anyone on the network could "
                "join the weight-sync group. Bind 127.0.0.1 or configure the pipeline.buffer.curve_* key files."
            )
        self._curve = curve
        self._auth = None
        self.config = config or WeightSyncConfig()
        self.config.validate("weights")
        self.backend = resolve_backend(self.config.backend, device)
        self._device = device
        self.model = model
        self.bind_host = bind_host
        self._control_port = control_port
        self._store_port = store_port
        self._provider = current_weights
        self._joins_in_thread = joins_in_thread
        # stamped on every version sent; pair ids carry it too, so they never collide with a previous learner's
        self._incarnation = incarnation or uuid.uuid4().hex[:8]
        self._pair_counter = itertools.count()
        self._transfer_lock = threading.RLock()
        self._registry = PeerTable(self._send)
        self._broadcaster = Transfer(self._registry, self._send, self.config, self._incarnation, dtype)
        self._context: zmq.Context | None = None
        self._outbox: Outbox | None = None
        self._control: ControlLoop | None = None
        self._join_sync: JoinSync | None = None
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
        self._control = ControlLoop(router, self._outbox, self._registry, self._handle, self.config)
        self._control.start()
        if self._provider is not None and self._joins_in_thread:
            self._join_sync = JoinSync(self._registry, self._broadcaster, self._provider, self._transfer_lock)
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

    def push(self, weights: Weights, version: int) -> PushReport:
        """Send ``weights`` (a `WeightSource` or named tensors) as ``version`` to every connected rollout and
        wait until each has it.

        Blocks for the transfer (and for rollouts to reach a step boundary, at most ``ready_timeout_s``).
        Never raises because of a rollout: failures are in the report (an error of the source itself, e.g.
        a failed gather, does raise). The tensors must not change until push returns (large tensors are
        broadcast straight from their memory).
        """
        with self._transfer_lock:
            peers = self._registry.connected()
            report = self._broadcaster.run(peers, version, weights)
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

    def serve_joins(self) -> PushReport | None:
        """With ``joins_in_thread=False``: give the current weights to the rollouts that joined since the last
        transfer, on the caller's thread; None when there were none (or the join-sync thread serves them).
        Errors of the provider or its source raise here."""
        if self._provider is None or self._joins_in_thread:
            return None
        with self._transfer_lock:
            return sync_newcomers(self._registry, self._broadcaster, self._provider)

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

    def _send(self, peer: Peer, message: msg.Message) -> None:
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
            if isinstance(message, msg.Ping):
                self._reply(routing_id, msg.Rejoin(message.pair_id, "unknown pair (learner restarted?)"))
            return  # a late message for a pair that is gone
        with self._registry.cond:
            peer.last_seen = time.monotonic()
            if isinstance(message, msg.Ready):
                peer.ready_version = message.version
            elif isinstance(message, msg.Applied):
                peer.ack = message
            self._registry.cond.notify_all()
        if isinstance(message, msg.Ping):
            self._reply(routing_id, msg.Pong(message.pair_id))
        elif isinstance(message, msg.Leave):
            self._registry.drop(peer, "left", tell=False)

    def _on_join(self, routing_id: bytes, join: msg.Join) -> None:
        if join.protocol != msg.PROTOCOL_VERSION:
            self._reply(routing_id, msg.Refuse(
                join.nonce, f"rollout {join.receiver_id!r} speaks weight protocol {join.protocol}, this learner "
                f"{msg.PROTOCOL_VERSION}: run the same drmas version on both"))
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
        peer = Peer(join.receiver_id, routing_id, pair_id, last_seen=time.monotonic(), ranks=join.ranks,
                    relay=join.relay)
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

    def _connect(self, peer: Peer) -> None:
        """Build the learner's end of ``peer``'s pair group (connect thread)."""
        local = self.bind_host if self.bind_host not in WILDCARD_HOSTS else ""
        try:
            pair = PairGroup.connect(self._store, peer.pair_id, 0, self.backend, self.config.timeout_s, local,
                                     world_size=1 + peer.ranks, device=self._device)
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
