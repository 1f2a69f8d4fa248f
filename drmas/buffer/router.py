"""`RouterServer`: the two ZeroMQ ROUTER sockets of the trajectory buffer and the loop that serves them.

This is the transport half of the buffer, kept apart from what the buffer does with messages
(`drmas.buffer.server`): binding (CURVE and the loopback rule included), the poll loop in a thread or in
the caller, decoding every request with its size limit, and answering every failure with a counted refusal
instead of raising. Two sockets, one per side (producers and learners), so that a flood of episodes never
delays a learner's pull: the loop serves learners first, since every pull frees space.

Threading: the poll loop runs either in the caller (`serve_forever`, for a process; `stop()` from a signal
handler ends it) or in a thread (`start`/`stop`, for tests and colocated use). Handlers run under `_lock`,
which in-process callers take as well.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import Counter
from typing import Callable, Optional

import zmq
import zmq.auth.thread

from drmas.buffer.framing import data_of, decode_buffer_request, encode_frames
from drmas.buffer.messages import REJECT_FRAMING, Ack, MessageError, recover_seq
from drmas.buffer.store import EpisodeRefused
from drmas.config.buffer import BufferConfig
from drmas.runtime.netsec import CurveKeys, is_local_endpoint, server_keys, start_curve_authenticator

log = logging.getLogger(__name__)

REJECT_INTERNAL = "internal_error"

TICK_S = 0.05  # longest poll: bounds the latency of stop(), timeouts and external discards
_MAX_BATCH = 32  # messages read from one socket before serving the other (keeps pulls prompt)
_HARD_SIZE_FACTOR = 4  # libzmq disconnects peers sending more than this many max_message_bytes


class InsecureEndpointError(ValueError):
    """Raised when the buffer would listen beyond this machine without CURVE authentication."""


class RouterServer:
    """Producer and consumer ROUTER sockets, CURVE, the poll loop; subclasses handle the messages.

    Args:
        config: endpoints and the message size limit.
        curve: CURVE keys; default: read from the config's key files, or none.
        clock: monotonic time source (injectable for tests).
    """

    thread_name = "drmas-buffer"

    def __init__(self, config: BufferConfig, curve: Optional[CurveKeys] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config.validate("buffer")
        self.config = config
        self._curve = curve if curve is not None else server_keys(config)
        for endpoint in (config.producer_endpoint, config.consumer_endpoint):
            if self._curve is None and not is_local_endpoint(endpoint):
                raise InsecureEndpointError(
                    f"refusing to bind {endpoint} without CURVE: anyone on the network could inject training "
                    "data. Bind 127.0.0.1 or configure buffer.curve_server_secret_file and "
                    "buffer.curve_authorized_keys_dir."
                )
        self._clock = clock
        # Stamped on every reply: clients that see it change know this buffer restarted and forgot what
        # they had sent before (unacknowledged episodes, reported versions) and recover instead of waiting.
        self.instance = uuid.uuid4().hex[:12]
        self._rejected: Counter[str] = Counter()
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

    def start(self) -> "RouterServer":
        """Serve in a background thread (tests, colocated runs); `stop()` ends it."""
        if self._thread is not None:
            raise RuntimeError("buffer already started")
        self._thread = threading.Thread(target=self.serve_forever, name=self.thread_name, daemon=True)
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

    def __enter__(self) -> "RouterServer":
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
                    self._end_round()
        finally:
            self._loop_ident = None
            self._release_sockets()
            self._loop_done.set()

    def _poll_timeout_ms(self) -> int:
        """How long the next poll may block; subclasses shorten it for deadlines of their own."""
        return math.ceil(TICK_S * 1000)

    def _drain(self, sock: zmq.Socket, handler: Callable[[bytes, object], None]) -> None:
        for _ in range(_MAX_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._handle_frames(sock, frames, handler)

    def _handle_frames(self, sock: zmq.Socket, frames: list[zmq.Frame], handler: Callable[[bytes, object], None]) -> None:
        """Decode one message and dispatch it; every failure is counted and answered, never raised.

        Frames are received without a copy: an episode's samples stay where they arrived (the received frames,
        or views of them) until they are forwarded -- large ones as the very frames, by reference, small ones
        joined into one frame (see `drmas.buffer.framing`)."""
        identity = frames[0].bytes
        seq = -1
        try:
            if len(frames) < 2:
                raise MessageError(REJECT_FRAMING, "no payload frame")
            message = decode_buffer_request(frames[1:], self.config.max_message_bytes)
            seq = message.seq
            handler(identity, message)
        except (MessageError, EpisodeRefused) as exc:
            if seq == -1 and len(frames) >= 2:
                seq = recover_seq(data_of(frames[1]))
            self._refuse(sock, identity, seq, exc.reason, exc.detail)
        except Exception as exc:  # a bug must cost one message, not the buffer
            log.exception("buffer: internal error while handling a message")
            self._refuse(sock, identity, seq, REJECT_INTERNAL, repr(exc))

    def _handle_producer(self, identity: bytes, message: object) -> None:
        raise NotImplementedError

    def _handle_consumer(self, identity: bytes, message: object) -> None:
        raise NotImplementedError

    def _housekeeping(self, now: float) -> None:
        """Timers: called after every poll, with the lock held."""

    def _end_round(self) -> None:
        """Called at the end of every round of the loop (after `_housekeeping`), with the lock held: replies
        gathered over the round (acknowledgements) go out here, one message per peer."""

    def _refuse(self, sock: zmq.Socket, identity: bytes, seq: int, reason: str, detail: str) -> None:
        self._rejected[reason] += 1
        log.debug("buffer: refused message seq=%s: %s %s", seq, reason, detail)
        self._send(sock, identity, Ack(seq=seq, accepted=False, reason=reason, detail=detail[:500]))

    def _send(self, sock: zmq.Socket, identity: bytes, message: object) -> bool:
        """Send without blocking; False when the peer is gone or not reading (the caller recovers)."""
        message.instance = self.instance  # type: ignore[attr-defined]
        try:
            # copy=False: a received frame is sent on by reference (libzmq counts the references of a received
            # message), joined small samples without another copy; pyzmq still copies short byte strings
            sock.send_multipart([identity, *encode_frames(message)], zmq.NOBLOCK, copy=False)
            return True
        except zmq.ZMQError as exc:  # EHOSTUNREACH (ROUTER_MANDATORY) or EAGAIN
            log.debug("buffer: could not send to a peer: %s", exc)
            return False
