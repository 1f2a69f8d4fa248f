"""`retrieval`: retrieval of the search system (which retriever, over which corpus, how many passages).

The retriever named by `backend` is looked up in `drmas.retrieval.RETRIEVERS` where it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f


@dataclass
class RetrievalConfig(Section):
    backend: str = _f(
        "bm25",
        "Retriever: 'bm25' (bm25s, in-process), 'dense' (sentence embeddings + faiss, in-process) or 'http' "
        "(a Search-R1 style /retrieve server at `url`, e.g. `drmas retriever serve`).",
    )
    corpus: Optional[str] = _f(
        None,
        "Passages jsonl ({'id', 'contents': 'title\\ntext'} per line). null: the task's own corpus (the "
        "generated multi-hop world provides one).",
    )
    topk: int = _f(3, "Passages returned per search query.")
    dense_model: Optional[str] = _f(
        None,
        "backend=dense: local sentence-embedding model directory (null: the offline all-MiniLM-L6-v2 package).",
    )
    url: str = _f("http://127.0.0.1:8000/retrieve", "backend=http: the retrieval server's /retrieve URL.")
    timeout_s: float = _f(30.0, "backend=http: seconds to wait for one retrieval request.")
    retries: int = _f(
        8,
        "backend=http: attempts after a failed connection, a timeout or an HTTP 5xx, waiting 0.5 s, 1 s, 2 s, ... "
        "(at most 30 s each; 8 ride out a server restart of about 90 s); a refused request (HTTP 4xx) is never retried.",
    )
    max_queries_per_request: int = _f(
        256, "backend=http: a round's queries are sent in requests of at most this many (servers cap batches).")
    index_dir: Optional[str] = _f(
        None, "Where built indexes are cached (null: <DRMAS_CACHE>/indexes, keyed by corpus content and settings)."
    )
    batch_size: int = _f(64, "backend=dense: passages embedded per forward pass while building the index.")

    def problems(self, where: str) -> list[str]:
        found = []
        for key, least in (("topk", 1), ("batch_size", 1), ("retries", 0), ("max_queries_per_request", 1)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                found.append(f"{where}.{key}: must be an integer >= {least}, got {value!r}")
        if not self.timeout_s > 0:
            found.append(f"{where}.timeout_s: must be > 0, got {self.timeout_s!r}")
        if self.backend == "http" and not str(self.url).startswith(("http://", "https://")):
            found.append(f"{where}.url: must be an http:// or https:// URL, got {self.url!r}")
        return found
