"""The learner's control thread: owns the ZeroMQ ROUTER of the weight channel (see ``sender.py``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from drmas.config.weights import WeightSyncConfig
from drmas.weights import messages as msg
from drmas.weights.learner.peers import PeerTable
from drmas.weights.transport import Outbox

log = logging.getLogger(__name__)


class ControlLoop(threading.Thread):
    """Owns the ROUTER socket: Joins, heartbeats, Ready/Applied bookkeeping, queued sends, silence expiry."""

    def __init__(
        self,
        router: zmq.Socket,
        outbox: Outbox,
        registry: PeerTable,
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
