"""A Retriever backed by any Search-R1 style retrieval server (`drmas retriever serve` or Search-R1's own).

It always asks for scores, but accepts both answer shapes: `{"document": row, "score": s}` items and bare
corpus rows (servers that ignore `return_scores`; their hits get score NaN). Rows may carry `contents` or
`title` + `text`. A batch of queries larger than `max_queries_per_request` goes out as several requests.

Failures that a restarting or overloaded server causes (no connection, a timeout, HTTP 5xx) are retried
`retries` times with exponential backoff, so a long training run survives a retrieval server restart; a
request the server refuses (HTTP 4xx) or an answer of the wrong shape is not retried. What still fails
raises `RetrievalServerError` with the URL and, for an HTTP error, the server's own message.
"""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.request
from typing import Sequence

from drmas.retrieval.base import Hit
from drmas.retrieval.corpus import CorpusError, passage_from_row


class RetrievalServerError(RuntimeError):
    """A retrieval server could not be reached, refused a request, or answered something unreadable."""


class _Transient(RetrievalServerError):
    """A failure a later attempt may not meet (no connection, timeout, HTTP 5xx)."""


class HttpRetriever:
    """Retriever protocol over HTTP: `search` POSTs to `url` (a server's /retrieve URL). Thread-safe."""

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 8, backoff_s: float = 0.5,
                 max_queries_per_request: int = 256):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval server URL must start with http:// or https://, got {url!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got {retries} and {backoff_s}")
        if max_queries_per_request < 1:
            raise ValueError(f"max_queries_per_request must be >= 1, got {max_queries_per_request}")
        self.url = url
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_queries_per_request = max_queries_per_request

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        queries = list(queries)
        hits: list[list[Hit]] = []
        for start in range(0, len(queries), self.max_queries_per_request):
            part = queries[start : start + self.max_queries_per_request]
            answer = self._post_with_retries({"queries": part, "topk": topk, "return_scores": True})
            hits.extend(self._parse(answer, len(part)))
        return hits

    def _post_with_retries(self, payload: dict) -> object:
        """`_post`, retried after failures worth retrying, waiting backoff_s, 2 x backoff_s, ... (at most 30 s)."""
        for attempt in range(self.retries + 1):
            try:
                return self._post(payload)
            except _Transient as exc:
                if attempt == self.retries:
                    raise RetrievalServerError(f"{exc} (after {attempt + 1} attempts)") from None
                time.sleep(min(30.0, self.backoff_s * 2**attempt))
        raise AssertionError("unreachable")

    def _post(self, payload: dict) -> object:
        request = urllib.request.Request(
            self.url, data=json.dumps(payload).encode("utf-8"), method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            error = _Transient if exc.code >= 500 else RetrievalServerError
            raise error(f"retrieval server {self.url} answered HTTP {exc.code}: {_server_message(exc)}") from None
        except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Transient(f"cannot reach retrieval server {self.url}: {reason}") from None
        try:
            return json.loads(body)
        except ValueError as exc:
            raise RetrievalServerError(f"retrieval server {self.url} answered invalid JSON: {exc}") from None

    def _parse(self, answer: object, n_queries: int) -> list[list[Hit]]:
        where = f"retrieval server {self.url}"
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
            raise RetrievalServerError(f"{where} answered without a 'result' list")
        result = answer["result"]
        if len(result) != n_queries:
            raise RetrievalServerError(f"{where} answered {len(result)} result lists for {n_queries} queries")
        hits: list[list[Hit]] = []
        for qi, items in enumerate(result):
            if not isinstance(items, list):
                raise RetrievalServerError(f"{where}: result[{qi}] is not a list")
            row_hits = []
            for ri, item in enumerate(items):
                item_where = f"{where}: result[{qi}][{ri}]"
                try:
                    row_hits.append(_hit_from_item(item, item_where))
                except CorpusError as exc:
                    raise RetrievalServerError(str(exc)) from None
            hits.append(row_hits)
        return hits


def _hit_from_item(item: object, where: str) -> Hit:
    """A scored item `{"document": row, "score": s}` or a bare corpus row as a Hit."""
    if isinstance(item, dict) and "document" in item:
        score = item.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise CorpusError(f"{where}: 'score' must be a number, got {type(score).__name__}")
        return Hit(passage=passage_from_row(item["document"], where, require_id=False), score=float(score))
    return Hit(passage=passage_from_row(item, where, require_id=False), score=math.nan)


def _server_message(exc: urllib.error.HTTPError) -> str:
    """The server's `{"error": ...}` message, else its raw body, else the HTTP reason."""
    try:
        body = exc.read()
    except OSError:
        body = b""
    try:
        payload = json.loads(body)
        if isinstance(payload, dict) and "error" in payload:
            return str(payload["error"])
    except ValueError:
        pass
    text = body.decode("utf-8", errors="replace").strip()
    return text[:500] if text else str(exc.reason)
