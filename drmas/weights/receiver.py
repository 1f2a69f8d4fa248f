"""Rollout side of the weight channel: join a learner, receive versioned weights, hand them to the engine.

A `WeightReceiver` keeps one **link thread** that owns the ZeroMQ DEALER socket: it joins the learner
(retrying with backoff while none answers), builds the pair group, heartbeats, and notices when the learner
is gone (no heartbeat reply for ``peer_timeout_s``, a Rejoin, or a failed transfer); then it tears the pair
down and joins again. So a restarted learner, or a learner that dropped this rollout, is re-synced without
anyone coordinating: the learner's join sync sends the current weights to every (re)joined rollout.

Announced updates are applied by whoever calls `poll()` (or by a background applier thread, see below). The
apply callback receives a *streaming* iterable: chunks are received while it consumes them, so memory stays
at a few chunk buffers whatever the model size (plus, on CPU, the few tensors larger than a chunk, kept
between updates to save page faults), and generation is paused for the transfer time (the engine's
``load_weights`` holds its generate lock while it iterates). The learner only starts broadcasting once the
callback has begun iterating (we then send Ready), so no collective timeout ever has to cover a generation
step.

Which mode the rollout loop should use: **`poll()` between generation steps**. The loop then decides where
versions switch (no update lands in the middle of its step), the update starts as soon as the step ends, and
no second thread competes for the engine lock: Python locks are not fair, so a loop that calls ``generate``
back to back can starve a background thread waiting in ``load_weights`` until the learner's
``ready_timeout_s`` drops the rollout. ``background=True`` (an applier thread) is for engines whose
``generate`` is called from elsewhere with natural gaps (a server) or for tests.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator

import torch
import torch.distributed as dist
import zmq

from drmas.netsec import CurveClientKeys
from drmas.weights import messages as msg
from drmas.weights.chunks import BufferPool, Layout, Unpacker
from drmas.weights.config import WeightSyncConfig
from drmas.weights.transport import Outbox, PairError, PairGroup, local_address_towards

log = logging.getLogger(__name__)

ApplyFn = Callable[[Iterable[tuple[str, torch.Tensor]], int, str], None]
"""``apply(named_tensors, version, incarnation)``, e.g. an engine's ``load_weights``; ``incarnation`` names the
learner process that made the weights (see `Manifest`). The tensors are zero-copy views of
receive buffers that are refilled once nothing views them any more: copy each one and let it go (keeping
them is safe, but then every kept buffer is replaced by a new allocation)."""


class TransferError(RuntimeError):
    """The pair failed while the apply callback was consuming an update."""


class _Session:
    """One pair with one learner, from its Welcome until it breaks."""

    def __init__(self, welcome: msg.Welcome, pair: PairGroup, store: dist.Store) -> None:
        self.pair_id = welcome.pair_id
        self.heartbeat_s = welcome.heartbeat_s
        self.peer_timeout_s = welcome.peer_timeout_s
        self.pair = pair
        self._store = store  # kept alive with the pair it rendezvoused on
        self.lock = threading.Lock()  # held by the thread applying an update over this pair
        self.broken: str | None = None  # set (by any thread) once the pair must not be used again
        self.last_reply = time.monotonic()
        self._pool: BufferPool | None = None

    def pool(self, layout: Layout) -> BufferPool:
        """Receive buffers sized for ``layout``, reused across updates of this session."""
        if self._pool is None or self._pool.nbytes != layout.chunk_bytes:
            # units posted ahead + the one being consumed + one the consumer may still hold a view of
            self._pool = BufferPool(layout.chunk_bytes, self.pair.device, keep=_ReceiveStream.AHEAD + 2)
        return self._pool

    def close(self) -> None:
        """Mark broken and release the pair once no update is using it (a running one ends by its timeout)."""
        if self.broken is None:
            self.broken = "closed"
        with self.lock:
            self.pair.close()
            self._store = None
            self._pool = None


class _Update:
    def __init__(self, session: _Session, manifest: msg.Manifest) -> None:
        self.session = session
        self.manifest = manifest


class _ReceiveStream:
    """Receives one update's units over a pair and yields its named tensors.

    Up to ``AHEAD`` units are posted ahead of the one being consumed, so the wire keeps moving while the
    apply callback copies. `finish` then receives whatever the consumer did not ask for, so the pair stays in
    step with the learner even if the apply callback stopped early or raised.
    """

    AHEAD = 2

    def __init__(self, session: _Session, layout: Layout, on_start: Callable[[], None]) -> None:
        self._session = session
        self._pair = session.pair
        self._layout = layout
        self._unpacker = Unpacker(layout, session.pool(layout))
        self._on_start = on_start
        self._started = False
        self._next = 0  # first unit not yet posted
        self._posted: deque[tuple[int, dist.Work | None]] = deque()  # posted, not yet waited, in order
        self._generator: Iterator[tuple[str, torch.Tensor]] | None = None
        self.failed: str | None = None

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        if self._session.broken is not None:
            raise PairError(f"pair unusable: {self._session.broken}")
        self._on_start()

    def _post_up_to(self, depth: int, target_of: Callable[[int], torch.Tensor]) -> None:
        while len(self._posted) < depth and self._next < len(self._layout.units):
            index = self._next
            self._next += 1
            work = self._pair.broadcast(target_of(index)) if self._layout.units[index].nbytes else None
            self._posted.append((index, work))

    def _wait_oldest(self) -> int:
        index, work = self._posted.popleft()
        if work is not None:
            self._pair.wait(work)
        return index

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._generator = self._tensors()
        return self._generator

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        try:
            self._start()
            self._post_up_to(self.AHEAD, self._unpacker.target)
            while self._posted:
                index = self._wait_oldest()
                self._post_up_to(self.AHEAD, self._unpacker.target)  # they arrive while this one is consumed
                for item in self._unpacker.complete(index):
                    yield item
                    del item  # hold no view of a buffer the pool may want to refill
        except PairError as error:
            self.failed = str(error)
            raise TransferError(f"weight transfer failed: {error}") from error

    def finish(self) -> None:
        """Close the consumer's iterator and receive (and discard) every unit it did not take."""
        if self._generator is not None:
            self._generator.close()
        if self.failed is not None:
            return
        try:
            self._start()
            while self._posted:
                self._wait_oldest()
            while self._next < len(self._layout.units):
                self._post_up_to(1, self._unpacker.discard)
                self._wait_oldest()
        except PairError as error:
            self.failed = str(error)
        finally:
            self._posted.clear()
            self._unpacker.release()


class _Link(threading.Thread):
    """Owns the DEALER socket: join with backoff, heartbeats, learner-loss detection, queued sends.

    It reports to its owner through two callbacks: ``on_update`` (a Manifest arrived) and ``on_session``
    (a session started, or ended: ``active`` False).
    """

    def __init__(
        self,
        endpoint: str,
        receiver_id: str,
        model: str,
        config: WeightSyncConfig,
        on_update: Callable[[_Update], None],
        on_session: Callable[[_Session, bool], None],
        curve: CurveClientKeys | None = None,
    ) -> None:
        super().__init__(name=f"drmas-weights-link-{receiver_id}", daemon=True)
        self._curve = curve
        self._endpoint = endpoint
        self._receiver_id = receiver_id
        self._model = model
        self._cfg = config
        self._on_update = on_update
        self._on_session = on_session
        self._context = zmq.Context()
        self.outbox = Outbox(self._context)
        self._socket: zmq.Socket | None = None
        self._nonce = itertools.count()
        self.stopping = threading.Event()
        self.session: _Session | None = None

    # -------------------------------------------------------------------------------------- main loop

    def run(self) -> None:
        cfg = self._cfg
        backoff = cfg.join_retry_s
        try:
            while not self.stopping.is_set():
                session = self._join(backoff)
                if session is None:
                    backoff = min(backoff * 2, 10 * cfg.join_retry_s)
                    continue
                backoff = cfg.join_retry_s
                self.session = session
                self._on_session(session, True)
                reason = self._serve(session)
                self.session = None
                self._on_session(session, False)
                if self.stopping.is_set():
                    self._send(msg.Leave(session.pair_id))
                else:
                    log.info("weights: %s lost pair %s: %s; re-joining", self._receiver_id, session.pair_id, reason)
                session.close()
        finally:
            if self._socket is not None:
                self._socket.close(linger=200)  # let a Leave go out
            self.outbox.close()
            self._context.term()

    def _new_socket(self) -> zmq.Socket:
        """A fresh DEALER: nothing queued for an earlier learner or pair can reach the next one."""
        if self._socket is not None:
            self._socket.close(linger=0)
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            sock.curve_secretkey = self._curve.secret
            sock.curve_publickey = self._curve.public
            sock.curve_serverkey = self._curve.server_public
        sock.connect(self._endpoint)
        self._socket = sock
        return sock

    def _send(self, message: msg.Message) -> None:
        if self._socket is None:
            return
        try:
            self._socket.send(msg.encode(message), zmq.NOBLOCK)
        except zmq.Again:  # not connected (learner down): the message would be stale by then anyway
            pass

    def _join(self, wait_s: float) -> _Session | None:
        """One Join attempt: Welcome within ``wait_s`` and a working pair, or None."""
        sock = self._new_socket()
        nonce = next(self._nonce)
        self._send(msg.Join(self._receiver_id, self._model, nonce))
        deadline = time.monotonic() + wait_s
        while not self.stopping.is_set():
            self.outbox.drain()  # Ready/Ack of a finished pair: nobody wants them now
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(min(100, int(left * 1000) + 1)):
                if left <= 0:
                    return None
                continue
            try:
                reply = msg.decode(sock.recv())
            except ValueError:
                continue
            if isinstance(reply, msg.Refuse) and reply.nonce == nonce:
                log.error("weights: learner at %s refused %s: %s", self._endpoint, self._receiver_id, reply.reason)
                return None
            if isinstance(reply, msg.Welcome) and reply.nonce == nonce:
                return self._connect(reply)
        return None

    def _connect(self, welcome: msg.Welcome) -> _Session | None:
        host = welcome.store_host or self._endpoint.split("://", 1)[1].rsplit(":", 1)[0]
        timeout_s = max(welcome.timeout_s, self._cfg.timeout_s)  # never give up before the learner does
        try:
            store = dist.TCPStore(host, welcome.store_port, None, False, datetime.timedelta(seconds=timeout_s))
            pair = PairGroup.connect(store, welcome.pair_id, 1, welcome.backend, timeout_s, local_address_towards(host))
        except (RuntimeError, PairError) as error:
            log.warning("weights: %s could not build pair %s: %s", self._receiver_id, welcome.pair_id, error)
            return None
        log.info("weights: %s joined %s (pair %s, %s)",
                 self._receiver_id, self._endpoint, welcome.pair_id, welcome.backend)
        return _Session(welcome, pair, store)

    def _serve(self, session: _Session) -> str:
        """Run the session until it breaks or we stop; returns why it ended."""
        sock = self._socket
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self.outbox.wakeup, zmq.POLLIN)
        next_beat = 0.0
        while not self.stopping.is_set():
            if session.broken is not None:
                return session.broken
            now = time.monotonic()
            if now - session.last_reply > session.peer_timeout_s:
                session.broken = f"learner silent for {now - session.last_reply:.1f} s"
                return session.broken
            if now >= next_beat:
                self._send(msg.Heartbeat(session.pair_id))
                next_beat = now + session.heartbeat_s
            events = dict(poller.poll(max(1, int((next_beat - now) * 1000))))
            if sock in events:
                self._receive_all(sock, session)
            for message in self.outbox.drain():
                if getattr(message, "pair_id", None) == session.pair_id:
                    self._send(message)
        return "receiver closing"

    def _receive_all(self, sock: zmq.Socket, session: _Session) -> None:
        while True:
            try:
                message = msg.decode(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            except ValueError:
                continue
            if getattr(message, "pair_id", None) != session.pair_id:
                continue  # for an earlier pair, or a stale Welcome
            session.last_reply = time.monotonic()
            if isinstance(message, msg.Manifest):
                self._on_update(_Update(session, message))
            elif isinstance(message, msg.Rejoin):
                session.broken = f"learner asked to re-join: {message.reason}"


class WeightReceiver:
    """Receives the weights a `WeightSender` pushes and applies them with ``apply_fn(named_tensors, version, incarnation)``.

    ``endpoint`` is the sender's `endpoint` (``tcp://host:port``). ``model`` ('' = any) is checked by the
    learner. With ``background=False`` (recommended for rollout loops, see the module docstring) updates are
    applied by `poll()`; with ``background=True`` an applier thread applies them as they come.
    """

    def __init__(
        self,
        endpoint: str,
        receiver_id: str,
        apply_fn: ApplyFn,
        timeout_s: float = 30.0,
        *,
        model: str = "",
        join_retry_s: float = 1.0,
        background: bool = False,
        config: WeightSyncConfig | None = None,
        curve: CurveClientKeys | None = None,
    ) -> None:
        """``config`` (if given) supplies ``join_retry_s``; the other timing settings come from the learner.
        ``curve``: this rollout's CURVE keys and the learner's (= the buffer's) public key, when CURVE is on."""
        self._curve = curve
        self.endpoint = endpoint
        self.receiver_id = receiver_id
        self.model = model
        self.config = config or WeightSyncConfig(timeout_s=timeout_s, join_retry_s=join_retry_s)
        self._apply_fn = apply_fn
        self._background = background
        self._cond = threading.Condition()
        self._pending: _Update | None = None
        self._version: int | None = None
        self.last_apply_s: float | None = None  # duration of the last apply callback (generation paused)
        self._link: _Link | None = None
        self._applier: threading.Thread | None = None
        self._connected = False

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> WeightReceiver:
        self._link = _Link(self.endpoint, self.receiver_id, self.model, self.config, self._offer, self._session_changed,
                           curve=self._curve)
        self._link.start()
        if self._background:
            self._applier = threading.Thread(
                target=self._apply_loop, name=f"drmas-weights-apply-{self.receiver_id}", daemon=True
            )
            self._applier.start()
        return self

    def close(self) -> None:
        """Leave the learner and stop the threads."""
        link, self._link = self._link, None
        if link is None:
            return
        link.stopping.set()
        with self._cond:
            self._cond.notify_all()
        link.join(timeout=self.config.timeout_s + 5)
        if self._applier is not None:
            self._applier.join(timeout=self.config.timeout_s + 5)

    def __enter__(self) -> WeightReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ public API

    @property
    def version(self) -> int | None:
        """The last version applied (None before the first)."""
        return self._version

    @property
    def connected(self) -> bool:
        return self._connected

    def poll(self) -> int | None:
        """Apply the announced update, if any, in the calling thread; returns its version, else None at once.

        Transport failures are absorbed (the link re-joins and the learner re-sends); an exception of the
        apply callback itself is re-raised after the learner has been told.
        """
        with self._cond:
            update, self._pending = self._pending, None
        if update is None:
            return None
        return self._apply(update)

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Block until a version >= ``version`` was applied (by another thread), or the timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._version is not None and self._version >= version, timeout=timeout
            )

    def has_pending(self) -> bool:
        with self._cond:
            return self._pending is not None

    # ------------------------------------------------------------------------------------------ internals

    def _offer(self, update: _Update) -> None:
        """A Manifest arrived (link thread): the next `poll` applies it."""
        with self._cond:
            self._pending = update
            self._cond.notify_all()

    def _session_changed(self, session: _Session, active: bool) -> None:
        """(link thread) An update announced on a session that ended can never be received: forget it."""
        self._connected = active
        if not active:
            with self._cond:
                if self._pending is not None and self._pending.session is session:
                    self._pending = None

    def _apply(self, update: _Update) -> int | None:
        session, manifest = update.session, update.manifest
        with session.lock:
            if session.broken is not None:
                return None
            stream = _ReceiveStream(
                session, manifest.layout,
                on_start=lambda: self._link_send(msg.Ready(session.pair_id, manifest.version)),
            )
            error: Exception | None = None
            start = time.monotonic()
            try:
                self._apply_fn(stream.tensors(), manifest.version, manifest.incarnation)
            except Exception as exc:  # reported to the learner below, re-raised unless the transport caused it
                error = exc
            elapsed = time.monotonic() - start
            stream.finish()
            if stream.failed is not None:
                session.broken = f"transfer of version {manifest.version} failed: {stream.failed}"
                log.warning("weights: %s: %s", self.receiver_id, session.broken)
                return None
            self._link_send(msg.Ack(session.pair_id, manifest.version, error is None, repr(error) if error else ""))
        if error is not None:
            raise error
        with self._cond:
            self._version = manifest.version
            self.last_apply_s = elapsed
            self._cond.notify_all()
        return manifest.version

    def _link_send(self, message: msg.Message) -> None:
        link = self._link
        if link is not None:
            link.outbox.put(message)

    def _apply_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._link is None, timeout=1.0)
                if self._link is None:
                    return
            try:
                self.poll()
            except Exception:
                log.exception("weights: %s: apply callback failed", self.receiver_id)

    @classmethod
    def from_config(cls, config: WeightSyncConfig, endpoint: str, receiver_id: str, apply_fn: ApplyFn,
                    **kwargs) -> WeightReceiver:
        return cls(endpoint, receiver_id, apply_fn, config=config, **kwargs)
