"""The link of a `WeightReceiver`: the thread that joins a learner and keeps the pair alive.

`Link` owns the ZeroMQ DEALER socket: it joins the learner (retrying with backoff while none answers),
builds its end of the pair group (a `PairMember`, or has the engine's workers build theirs, through `OwnerJobs`), heartbeats, and notices
when the learner is gone (no heartbeat reply for ``peer_timeout_s``, a Rejoin, or a failed transfer); then it
tears the pair down and joins again. What it learns reaches the receiver as a `Session` (started or ended)
and `Update`s (a Manifest arrived).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

import zmq

from drmas.config.weights import WeightSyncConfig
from drmas.runtime.netsec import CurveClientKeys
from drmas.weights import messages as msg
from drmas.weights.rollout.member import PairMember, PairSpec, WorkerReceivers
from drmas.weights.transport import Outbox, PairError

log = logging.getLogger(__name__)


class OwnerJobs:
    """Work the link thread needs done by the thread that drives the engine (`poll`'s caller): building or
    releasing the pair ends of an engine's workers must not race the engine's own steps."""

    def __init__(self, on_submit: Callable[[], None] = lambda: None) -> None:
        self._jobs: deque[tuple[Callable[[], None], Future]] = deque()
        self._lock = threading.Lock()
        self._on_submit = on_submit  # wakes a background applier

    def submit(self, job: Callable[[], None]) -> Future:
        future: Future = Future()
        with self._lock:
            self._jobs.append((job, future))
        self._on_submit()
        return future

    def pending(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def run(self) -> None:
        """Run every queued job here (a job that the link gave up on is skipped)."""
        while True:
            with self._lock:
                if not self._jobs:
                    return
                job, future = self._jobs.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                job()
            except BaseException as error:  # handed to whoever waits on it
                future.set_exception(error)
            else:
                future.set_result(None)


class Session:
    """One pair with one learner, from its Welcome until it breaks.

    The pair's receiving end is either ``member`` (this process is rank 1) or the engine's workers
    (``workers``, ranks 1..N), which are released through ``owner`` jobs.
    """

    def __init__(self, welcome: msg.Welcome, member: PairMember | None,
                 workers: WorkerReceivers | None = None, owner: OwnerJobs | None = None) -> None:
        self.pair_id = welcome.pair_id
        self.heartbeat_s = welcome.heartbeat_s
        self.peer_timeout_s = welcome.peer_timeout_s
        self.member = member
        self.workers = workers
        self._owner = owner
        self.lock = threading.Lock()  # held by the thread applying an update over this pair
        self.broken: str | None = None  # set (by any thread) once the pair must not be used again
        self.last_reply = time.monotonic()
        self._routes = threading.Condition()
        self._route: msg.Route | None = None

    def offer_route(self, route: msg.Route | None) -> None:
        """(link thread) The learner's Route for the update being received; None forgets an unused one (a
        new Manifest arrived)."""
        with self._routes:
            self._route = route
            self._routes.notify_all()

    def take_route(self, version: int, timeout_s: float) -> msg.Route:
        """(applying thread, after Ready) Wait for the Route of ``version``; `PairError` when none comes (the
        learner gave up on this rollout, or the pair broke)."""
        with self._routes:
            got = self._routes.wait_for(
                lambda: self.broken is not None or (self._route is not None and self._route.version == version),
                timeout=timeout_s,
            )
            route, self._route = self._route, None
        if not got or self.broken is not None or route is None:
            raise PairError(f"no route for version {version} within {timeout_s:g} s ({self.broken or 'timeout'})")
        return route

    def close(self) -> None:
        """Mark broken and release the pair once no update is using it (a running one ends by its timeout)."""
        if self.broken is None:
            self.broken = "closed"
        with self._routes:  # an applier waiting for a Route gives up now, not at its timeout
            self._routes.notify_all()
        with self.lock:
            if self.member is not None:
                self.member.close()
            if self.workers is not None and self._owner is not None:
                workers, pair_id = self.workers, self.pair_id
                self._owner.submit(lambda: workers.close_weights(pair_id))
                self.workers = None


class Update:
    def __init__(self, session: Session, manifest: msg.Manifest) -> None:
        self.session = session
        self.manifest = manifest


class Link(threading.Thread):
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
        on_update: Callable[[Update], None],
        on_session: Callable[[Session, bool], None],
        curve: CurveClientKeys | None = None,
        workers: WorkerReceivers | None = None,
        owner: OwnerJobs | None = None,
    ) -> None:
        super().__init__(name=f"drmas-weights-link-{receiver_id}", daemon=True)
        self._curve = curve
        self._workers = workers
        self._owner = owner
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
        self.session: Session | None = None

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

    def _join(self, wait_s: float) -> Session | None:
        """One Join attempt: Welcome within ``wait_s`` and a working pair, or None."""
        sock = self._new_socket()
        nonce = next(self._nonce)
        self._send(msg.Join(self._receiver_id, self._model, nonce, ranks=self._ranks(), relay=self._workers is None))
        deadline = time.monotonic() + wait_s
        while not self.stopping.is_set():
            self.outbox.drain()  # Ready/Applied of a finished pair: nobody wants them now
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

    def _ranks(self) -> int:
        """Receiving ranks this rollout brings: its engine's workers, or this process alone."""
        return self._workers.weight_ranks() if self._workers is not None else 1

    def _connect(self, welcome: msg.Welcome) -> Session | None:
        host = welcome.store_host or self._endpoint.split("://", 1)[1].rsplit(":", 1)[0]
        timeout_s = max(welcome.timeout_s, self._cfg.timeout_s)  # never give up before the learner does
        spec = PairSpec(welcome.pair_id, host, welcome.store_port, welcome.backend, timeout_s, 1 + self._ranks())
        if self._workers is not None:
            return self._connect_workers(welcome, spec)
        try:
            member = PairMember(spec, rank=1)
        except (RuntimeError, PairError) as error:
            log.warning("weights: %s could not build pair %s: %s", self._receiver_id, welcome.pair_id, error)
            return None
        log.info("weights: %s joined %s (pair %s, %s)",
                 self._receiver_id, self._endpoint, welcome.pair_id, welcome.backend)
        return Session(welcome, member)

    def _connect_workers(self, welcome: msg.Welcome, spec: PairSpec) -> Session | None:
        """Have the engine's workers build the pair (in the thread that drives the engine, see `OwnerJobs`)."""
        workers, owner = self._workers, self._owner
        ranks, timeout_s = spec.world_size - 1, spec.timeout_s
        future = owner.submit(lambda: workers.connect_weights(spec))
        deadline = time.monotonic() + 2 * timeout_s  # the engine thread may first finish a generation step
        while not self.stopping.is_set():
            try:
                future.result(timeout=0.1)
            except FutureTimeout:
                if time.monotonic() < deadline:
                    continue
                break
            except Exception as error:  # noqa: BLE001 -- any worker failure: join again
                log.warning("weights: %s: engine workers could not build pair %s: %s",
                            self._receiver_id, welcome.pair_id, error)
                break
            log.info("weights: %s joined %s (pair %s, %s, %d engine workers receiving)",
                     self._receiver_id, self._endpoint, welcome.pair_id, welcome.backend, ranks)
            return Session(welcome, None, workers=workers, owner=owner)
        if not future.cancel() and not future.done() and not self.stopping.is_set():
            log.warning("weights: %s: the engine did not build pair %s within %.0f s",
                        self._receiver_id, welcome.pair_id, 2 * timeout_s)
        owner.submit(lambda: workers.close_weights(welcome.pair_id))  # whatever part of it was built
        return None

    def _serve(self, session: Session) -> str:
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
                self._send(msg.Ping(session.pair_id))
                next_beat = now + session.heartbeat_s
            events = dict(poller.poll(max(1, int((next_beat - now) * 1000))))
            if sock in events:
                self._receive_all(sock, session)
            for message in self.outbox.drain():
                if getattr(message, "pair_id", None) == session.pair_id:
                    self._send(message)
        return "receiver closing"

    def _receive_all(self, sock: zmq.Socket, session: Session) -> None:
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
                session.offer_route(None)
                self._on_update(Update(session, message))
            elif isinstance(message, msg.Route):
                session.offer_route(message)
            elif isinstance(message, msg.Rejoin):
                session.broken = f"learner asked to re-join: {message.reason}"
                session.offer_route(None)
