"""An HTTP service hardened for the open network: uvicorn on a socket of its own, served in the foreground or on
a background thread. The retrieval server and the rollout gateway both serve their Starlette apps with it.

Why uvicorn, and what is added to it: the standard library's ThreadingHTTPServer the retrieval server first used
fell to a simple attack. Its listen backlog of 5 reset connections of 50 parallel clients, a slow client held a
thread forever, a client disconnect printed a traceback, and an oversized body got a broken pipe instead of its
413. Here:

- one asyncio event loop owns every connection, so a slow client costs a socket, not a thread (an app runs its
  blocking work elsewhere: a thread pool, or the thread that owns it); the listen backlog is `backlog` (2048);
- a client must deliver each whole request (headers and body) within `request_timeout_s` of connecting or of
  its previous response, or its connection is closed (uvicorn alone only times out idle keep-alive
  connections, `keep_alive_s`); past `max_connections` connections new requests get 503, which clients retry;
- a refused body is not left unread: uvicorn discards what still arrives (until the deadline), because closing
  a socket with unread data makes the kernel reset the connection, and the client would lose its 413;
- a client that goes away mid-request is a debug line, not a traceback; uvicorn's access log is off.

`read_body` bounds a request body (on Content-Length before a byte is read, and again while a chunked body
streams in); `RequestError` is a refusal with its HTTP status.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from functools import partial
from http import HTTPStatus
from typing import Any, Optional

import h11
import uvicorn
from starlette.requests import Request
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_RECEIVING = (h11.IDLE, h11.SEND_BODY)  # h11 states of a client whose next request is not complete yet


class RequestError(ValueError):
    """A request the server refuses, with the HTTP status to answer."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The whole body, refused with 413 past `max_bytes`: on Content-Length before reading, else while streaming."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:  # h11 has already checked its syntax
        raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body of {length} bytes, at most {max_bytes}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"request body of more than {max_bytes} bytes, at most {max_bytes}")
    return bytes(body)


class _DeadlineH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus a deadline for receiving each whole request (the slow-client defence).

    The deadline starts when the connection opens and again when a response completes, and is cancelled once
    the request's last body byte is in, so slowly dribbling bytes does not extend it.
    """

    def __init__(self, *args: Any, request_timeout_s: float, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._request_timeout_s = request_timeout_s
        self._deadline: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in _RECEIVING:
            self._cancel_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state in _RECEIVING:
            self._arm_deadline()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def _arm_deadline(self) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(self._request_timeout_s, self._deadline_passed)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _deadline_passed(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.debug("closing the connection from %s: no whole request within %.3g s", self.client,
                      self._request_timeout_s)
            self.transport.close()


class _UvicornServer(uvicorn.Server):
    """uvicorn's server that says when it serves and, on shutdown, drops what is still open after `grace_s`.

    Dropping a connection (rather than letting uvicorn cancel its task at its own graceful timeout) ends a
    request quietly: a handler waiting for the body sees a client disconnect, and an answer has no one to go to.
    A handler still running `grace_s` later (awaiting something that never comes) is cancelled by uvicorn's
    graceful timeout (set to twice `grace_s` by `HttpService`), with an error line: uvicorn alone would wait for it
    for good, and the process could not stop.
    """

    def __init__(self, config: uvicorn.Config, grace_s: float):
        super().__init__(config)
        self.serving = threading.Event()
        self._grace_s = grace_s

    async def startup(self, sockets: Optional[list[socket.socket]] = None) -> None:
        await super().startup(sockets=sockets)
        self.serving.set()

    async def shutdown(self, sockets: Optional[list[socket.socket]] = None) -> None:
        drop = asyncio.get_running_loop().call_later(self._grace_s, self._drop_connections)
        try:
            await super().shutdown(sockets=sockets)
        finally:
            drop.cancel()
            self._drop_connections()
            await asyncio.sleep(0)  # let the transports report connection_lost before the loop closes

    def _drop_connections(self) -> None:
        for connection in list(self.server_state.connections):
            connection.transport.close()


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket, bound now so that `port=0` has its real port before serving starts."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class HttpService:
    """Serves an ASGI `app` on `host:port` (`port=0` picks a free port, known from `address` at once).

    Use `serve_forever()` in the foreground, or `start()` / `close()` to run it on a daemon thread named `name`.
    One object serves once: `close()` releases its socket for good.
    """

    def __init__(self, app: Any, host: str, port: int, name: str, backlog: int = 2048,
                 request_timeout_s: float = 30.0, keep_alive_s: float = 5.0, max_connections: int = 1024,
                 shutdown_grace_s: float = 5.0):
        for key, value in (("backlog", backlog), ("max_connections", max_connections)):
            if value < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        for key, value in (("request_timeout_s", request_timeout_s), ("keep_alive_s", keep_alive_s),
                           ("shutdown_grace_s", shutdown_grace_s)):
            if value <= 0:
                raise ValueError(f"{key} must be > 0, got {value}")
        self.name = name
        config = uvicorn.Config(
            app, http=partial(_DeadlineH11Protocol, request_timeout_s=request_timeout_s),  # type: ignore[arg-type]
            ws="none", lifespan="off", log_config=None, access_log=False, proxy_headers=False, server_header=False,
            backlog=backlog, timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]  # a float works
            limit_concurrency=max_connections,
            timeout_graceful_shutdown=2 * shutdown_grace_s,  # type: ignore[arg-type]  # see _UvicornServer
        )
        self._server = _UvicornServer(config, grace_s=shutdown_grace_s)
        self._sock = _listen(host, port, backlog)  # last: nothing above holds an OS resource yet
        self._thread: Optional[threading.Thread] = None
        self._ran = False
        self._stopped = threading.Event()
        self._address: tuple[str, int] = self._sock.getsockname()[:2]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._address
        return str(host), int(port)

    def base_url(self, host: Optional[str] = None) -> str:
        """`http://host:port` of this service (`host`: how a client reaches it, default the bound address)."""
        bound, port = self.address
        host = host or bound
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve in this thread until `close()` from another thread (or, in the main thread, SIGINT/SIGTERM)."""
        if self._ran:
            raise RuntimeError(f"this {self.name} has already served or been closed; make a new one")
        self._ran = True
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self._stopped.set()

    def start(self, timeout_s: float = 30.0) -> "HttpService":
        """Serve on a daemon thread; returns self once the server answers (connections queue meanwhile)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self.serve_forever, name=self.name, daemon=True)
            self._thread.start()
            deadline = time.monotonic() + timeout_s
            while not self._server.serving.wait(0.05):
                if self._stopped.is_set() or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} on {self.base_url()} did not start (see the log)")
        return self

    def close(self) -> None:
        """Stop serving: let in-flight requests finish (connections still open after the shutdown grace are
        dropped, handlers still running after twice the grace cancelled), then release the socket and the thread.
        Callable from any thread, more than once."""
        self._server.should_exit = True
        if not self._ran:  # never served, and now never will
            self._ran = True
            self._stopped.set()
        self._stopped.wait()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._sock.close()  # uvicorn closed it if it served; closing twice is harmless
