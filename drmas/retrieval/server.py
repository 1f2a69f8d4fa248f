"""A retrieval HTTP service speaking the Search-R1 API, so drmas and existing Search-R1 clients share servers.

The API (routes, request and answer JSON, limits) is `drmas.retrieval.api`; this module serves it with the
hardened uvicorn service of `drmas.runtime.http` (deadlines for slow clients, bounded connections and bodies,
quiet disconnects; see there why), in the foreground (`serve_forever`, what `drmas retriever serve` runs) or on
a background thread (`start` / `close`, what tests and in-process users run). There is no authentication:
bind it to a loopback address unless the network is trusted (`drmas retriever serve` warns otherwise).

Retrieval (synchronous, CPU-bound, thread-safe) runs on a pool of `workers` threads, which bounds how many
searches run at once while the event loop keeps answering.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from drmas.retrieval.api import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUERIES, DEFAULT_MAX_TOPK, ApiLimits, build_app
from drmas.retrieval.base import Retriever
from drmas.runtime.http import HttpService

DEFAULT_WORKERS = min(4, os.cpu_count() or 1)


class RetrievalServer:
    """A Search-R1 compatible retrieval server around `retriever`; `port=0` picks a free port.

    Use `serve_forever()` in the foreground, or `start()` / `close()` (or `with`) to run it on a background
    thread. One object serves once: `close()` releases its socket and threads for good.
    """

    def __init__(self, retriever: Retriever, host: str = "127.0.0.1", port: int = 8000, default_topk: int = 3,
                 max_queries: int = DEFAULT_MAX_QUERIES, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_topk: int = DEFAULT_MAX_TOPK, workers: int = DEFAULT_WORKERS, backlog: int = 2048,
                 request_timeout_s: float = 30.0, keep_alive_s: float = 5.0, max_connections: int = 1024,
                 shutdown_grace_s: float = 5.0):
        limits = ApiLimits(default_topk=default_topk, max_topk=max_topk, max_queries=max_queries,
                           max_body_bytes=max_body_bytes)
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="retrieval-worker")  # threads start lazily
        try:
            self._http = HttpService(build_app(retriever, limits, self._executor), host, port, "retrieval server",
                                     backlog=backlog, request_timeout_s=request_timeout_s, keep_alive_s=keep_alive_s,
                                     max_connections=max_connections, shutdown_grace_s=shutdown_grace_s)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    @property
    def address(self) -> tuple[str, int]:
        return self._http.address

    @property
    def url(self) -> str:
        """The /retrieve URL (what `retrieval.url` and `HttpRetriever` take)."""
        return f"{self._http.base_url()}/retrieve"

    def serve_forever(self) -> None:
        """Serve in this thread until `close()` from another thread (or, in the main thread, SIGINT/SIGTERM)."""
        self._http.serve_forever()

    def start(self, timeout_s: float = 30.0) -> "RetrievalServer":
        """Serve on a daemon thread; returns self once the server answers (connections queue meanwhile)."""
        self._http.start(timeout_s)
        return self

    def close(self) -> None:
        """Stop serving: let in-flight requests finish (connections still open after `shutdown_grace_s` are
        dropped), then release the socket and the threads. Callable from any thread, more than once."""
        self._http.close()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "RetrievalServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
