"""A retrieval HTTP service speaking the Search-R1 API, so drmas and existing Search-R1 clients share servers.

    POST /retrieve  {"queries": [str, ...], "topk": int (optional), "return_scores": bool (optional)}
                 -> {"result": [[row, ...], ...]}                        one list per query, best first
                 -> {"result": [[{"document": row, "score": s}, ...]]}   with "return_scores": true
    GET  /health -> {"status": "ok", "passages": n, "topk": default topk}

`row` is the corpus row unchanged (`{"id", "contents"}`). A malformed request gets HTTP 400 with
`{"error": "..."}` naming the problem; an unknown path 404. Built on the standard library's threading HTTP
server (one thread per connection) with msgspec for strict request decoding: no web framework to install,
and the retriever, which is thread-safe, is shared by all requests. There is no authentication: bind it to a
loopback address unless the network is trusted.
"""

from __future__ import annotations

import logging
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

import msgspec

from drmas.retrieval.base import Retriever

log = logging.getLogger(__name__)

DEFAULT_MAX_QUERIES = 1024
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class RetrieveRequest(msgspec.Struct):
    """The body of `POST /retrieve` (unknown fields are ignored, as Search-R1 servers do)."""

    queries: list[str]
    topk: Optional[int] = None
    return_scores: bool = False


class RequestError(ValueError):
    """A request the server refuses, with the HTTP status to answer."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def decode_request(body: bytes, max_queries: int) -> RetrieveRequest:
    """Strictly decode and check a /retrieve body; RequestError(400) names the problem."""
    try:
        req = msgspec.json.decode(body, type=RetrieveRequest)
    except msgspec.ValidationError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"request body is not valid JSON: {exc}") from None
    if req.topk is not None and req.topk < 1:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid request: 'topk' must be >= 1, got {req.topk}")
    if len(req.queries) > max_queries:
        raise RequestError(HTTPStatus.BAD_REQUEST,
                           f"invalid request: {len(req.queries)} queries, at most {max_queries} per request")
    return req


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection for many requests

    def do_GET(self) -> None:
        if self.path == "/health":
            s = self.server
            self._send(HTTPStatus.OK, {"status": "ok", "passages": s.n_passages, "topk": s.default_topk})
        elif self.path == "/retrieve":
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "use POST /retrieve", allow="POST")
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such path: {self.path} (paths: POST /retrieve, GET /health)")

    def do_POST(self) -> None:
        if self.path != "/retrieve":
            self._discard_body()
            if self.path == "/health":
                self._error(HTTPStatus.METHOD_NOT_ALLOWED, "use GET /health", allow="GET")
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no such path: {self.path} (paths: POST /retrieve, GET /health)")
            return
        try:
            req = decode_request(self._read_body(), self.server.max_queries)
        except RequestError as exc:
            self._error(exc.status, str(exc))
            return
        topk = req.topk if req.topk is not None else self.server.default_topk
        try:
            hits = self.server.retriever.search(req.queries, topk)
        except Exception as exc:  # a retriever failure is the server's fault, not the client's
            log.exception("retrieval failed")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"retrieval failed: {type(exc).__name__}: {exc}")
            return
        if req.return_scores:
            result = [[{"document": h.passage.row(), "score": h.score} for h in q] for q in hits]
        else:
            result = [[h.passage.row() for h in q] for q in hits]
        self._send(HTTPStatus.OK, {"result": result})

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise RequestError(HTTPStatus.LENGTH_REQUIRED, "missing Content-Length header")
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length header: {length!r}") from None
        if n < 0:
            self.close_connection = True
            raise RequestError(HTTPStatus.BAD_REQUEST, f"bad Content-Length header: {length!r}")
        if n > self.server.max_body_bytes:
            self.close_connection = True  # the unread body would otherwise be parsed as the next request
            raise RequestError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"request body of {n} bytes, at most {self.server.max_body_bytes}")
        return self.rfile.read(n)

    def _discard_body(self) -> None:
        try:
            self._read_body()
        except RequestError:
            pass

    def _error(self, status: HTTPStatus, message: str, allow: Optional[str] = None) -> None:
        self._send(status, {"error": message}, {"Allow": allow} if allow else None)

    def _send(self, status: HTTPStatus, payload: dict, headers: Optional[dict] = None) -> None:
        body = msgspec.json.encode(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # route access logs to logging, not stderr
        log.debug("%s - %s", self.address_string(), format % args)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    retriever: Retriever
    n_passages: Optional[int]
    default_topk: int
    max_queries: int
    max_body_bytes: int


class _Server6(_Server):
    address_family = socket.AF_INET6


class RetrievalServer:
    """A Search-R1 compatible retrieval server around `retriever`; `port=0` picks a free port.

    Use `serve_forever()` in the foreground, or `start()` / `close()` (or `with`) to run it on a background thread.
    """

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                 max_queries: int = DEFAULT_MAX_QUERIES, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES):
        if default_topk < 1:
            raise ValueError(f"default topk must be >= 1, got {default_topk}")
        if max_queries < 1:
            raise ValueError(f"max_queries must be >= 1, got {max_queries}")
        server_class = _Server6 if ":" in host else _Server  # an IPv6 literal such as "::1"
        self._httpd = server_class((host, port), _Handler)
        self._httpd.retriever = retriever
        passages = getattr(retriever, "passages", None)
        self._httpd.n_passages = len(passages) if passages is not None else None
        self._httpd.default_topk = default_topk
        self._httpd.max_queries = max_queries
        self._httpd.max_body_bytes = max_body_bytes
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The /retrieve URL (what `retrieval.url` and `HttpRetriever` take)."""
        host, port = self.address
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/retrieve"

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def start(self) -> "RetrievalServer":
        """Serve on a daemon thread; returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever, name="retrieval-server", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving (if started in the background) and release the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> "RetrievalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
