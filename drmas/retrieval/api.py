"""The Search-R1 retrieval API as an ASGI app (Starlette); `drmas.retrieval.server` serves it over HTTP.

    POST /retrieve  {"queries": [str, ...], "topk": int (optional), "return_scores": bool (optional)}
                 -> {"result": [[row, ...], ...]}                        one list per query, best first
                 -> {"result": [[{"document": row, "score": s}, ...]]}   with "return_scores": true
    GET  /health -> {"status": "ok", "passages": n, "topk": default topk}

`row` is the corpus row unchanged (`{"id", "contents"}`). A request the server refuses gets a JSON
`{"error": "..."}` naming the problem: 400 for a malformed one, 413 for a body over the limit, 404 for an
unknown path, 405 for a wrong method. msgspec decodes requests strictly, so the message names the bad field.

Every request is bounded, because the answer grows with queries x topk and the server reads the whole body
before decoding it: `max_queries` queries, `topk <= max_topk` (an unbounded topk once let one request build
a 321 MB answer), and `max_body_bytes`, checked on Content-Length before a byte of the body is read and
again while a chunked body streams in. A topk beyond the corpus size is served as the whole corpus, so the
retriever never sizes work by a number larger than it needs. The retriever is synchronous, CPU-bound and
thread-safe: it runs (with the JSON encoding of its answer) on the executor the server hands in, so the
event loop keeps accepting and answering other connections meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Optional

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from drmas.retrieval.base import Retriever
from drmas.runtime.http import RequestError, read_body

log = logging.getLogger(__name__)

DEFAULT_MAX_TOPK = 100
DEFAULT_MAX_QUERIES = 1024
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
ROUTES = {"/retrieve": "POST", "/health": "GET"}  # path -> its one method, for error messages
_PATHS = ", ".join(f"{method} {path}" for path, method in ROUTES.items())


@dataclass(frozen=True)
class ApiLimits:
    """What one request may ask for; checked here so a bad server setting fails at startup, not per request."""

    default_topk: int = 3
    max_topk: int = DEFAULT_MAX_TOPK
    max_queries: int = DEFAULT_MAX_QUERIES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __post_init__(self) -> None:
        for name in ("default_topk", "max_topk", "max_queries", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.default_topk > self.max_topk:
            raise ValueError(f"default topk {self.default_topk} is over max_topk {self.max_topk}")


class RetrieveRequest(msgspec.Struct):
    """The body of `POST /retrieve` (unknown fields are ignored, as Search-R1 servers do)."""

    queries: list[str]
    topk: Optional[int] = None
    return_scores: bool = False


def decode_request(body: bytes, limits: ApiLimits) -> RetrieveRequest:
    """Strictly decode and check a /retrieve body; RequestError(400) names the problem."""
    try:
        req = msgspec.json.decode(body, type=RetrieveRequest)
    except msgspec.ValidationError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RequestError(HTTPStatus.BAD_REQUEST, f"request body is not valid JSON: {exc}") from None
    if req.topk is not None and not 1 <= req.topk <= limits.max_topk:
        bound = "must be >= 1" if req.topk < 1 else f"must be at most max_topk={limits.max_topk}"
        raise RequestError(HTTPStatus.BAD_REQUEST, f"invalid request: 'topk' {bound}, got {req.topk}")
    if len(req.queries) > limits.max_queries:
        raise RequestError(HTTPStatus.BAD_REQUEST,
                           f"invalid request: {len(req.queries)} queries, at most {limits.max_queries} per request")
    return req


def build_app(retriever: Retriever, limits: ApiLimits, executor: Executor) -> Starlette:
    """The API around `retriever`; `executor` runs the searches (its size bounds how many run at once)."""
    passages = getattr(retriever, "passages", None)
    n_passages = len(passages) if passages is not None else None

    async def health(request: Request) -> Response:
        return _json(HTTPStatus.OK, {"status": "ok", "passages": n_passages, "topk": limits.default_topk})

    async def retrieve(request: Request) -> Response:
        try:
            req = decode_request(await read_body(request, limits.max_body_bytes), limits)
        except RequestError as exc:
            return _json(exc.status, {"error": str(exc)})
        except ClientDisconnect:  # nobody to answer: a debug line, not an error
            log.debug("client %s disconnected before its request was complete", _peer(request))
            return Response(status_code=HTTPStatus.BAD_REQUEST)  # uvicorn drops it: the connection is gone
        topk = req.topk if req.topk is not None else limits.default_topk
        if n_passages is not None:
            topk = max(1, min(topk, n_passages))
        loop = asyncio.get_running_loop()
        try:
            body = await loop.run_in_executor(executor, _answer, retriever, req.queries, topk, req.return_scores)
        except Exception as exc:  # a retriever failure is the server's fault, not the client's
            log.exception("retrieval failed")
            return _json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"})
        return Response(body, media_type="application/json")

    app = Starlette(routes=[Route("/retrieve", retrieve, methods=["POST"]), Route("/health", health, methods=["GET"])],
                    exception_handlers={HTTPException: _http_error})
    app.router.redirect_slashes = False  # "/retrieve/" is an unknown path (404), not a redirect
    return app


def _answer(retriever: Retriever, queries: list[str], topk: int, return_scores: bool) -> bytes:
    """Search and encode on a worker thread: both are CPU-bound and grow with queries x topk."""
    hits = retriever.search(queries, topk)
    if return_scores:
        result = [[{"document": h.passage.row(), "score": h.score} for h in q] for q in hits]
    else:
        result = [[h.passage.row() for h in q] for q in hits]
    return msgspec.json.encode({"result": result})


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's routing errors (404, 405) as JSON `{"error": ...}` like every other refusal."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    if exc.status_code == HTTPStatus.NOT_FOUND:
        message = f"no such path: {path} (paths: {_PATHS})"
    elif exc.status_code == HTTPStatus.METHOD_NOT_ALLOWED and path in ROUTES:
        message = f"use {ROUTES[path]} {path}"
    else:
        message = exc.detail
    return _json(exc.status_code, {"error": message}, exc.headers)


def _json(status: int, payload: dict, headers: Optional[dict] = None) -> Response:
    return Response(msgspec.json.encode(payload), status_code=status, headers=headers, media_type="application/json")


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"
