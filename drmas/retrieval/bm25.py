"""Sparse retrieval with bm25s: the search system's default retriever, in-process and CPU-only.

Passages are tokenised as "title text" with English stopwords removed and, when PyStemmer is installed, Snowball
English stemming (it is optional: the index key records whether it was used, so a cache built with stemming is
never queried without it). The built index is cached on disk under a directory named after the corpus
fingerprint and these settings, and loaded instead of rebuilt when the same corpus comes again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from drmas.retrieval.base import Hit, Passage, hits_per_query
from drmas.retrieval.corpus import corpus_fingerprint
from drmas.retrieval.index_cache import build_once, cache_key, index_root

log = logging.getLogger(__name__)

# Bump when the on-disk layout or the tokenisation changes, so stale caches are rebuilt rather than reused.
_FORMAT = "bm25s-1"
_STOPWORDS = "en"


def _english_stemmer():
    """PyStemmer's English stemmer, or None when PyStemmer is not installed."""
    try:
        import Stemmer  # PyStemmer
    except ImportError:
        return None
    return Stemmer.Stemmer("english")


class BM25Retriever:
    """BM25 over a list of passages; `search` may be called from several threads at once.

    `index_dir` is the cache root (default `<DRMAS_CACHE or ~/.cache/drmas>/indexes`); the index itself lives in
    `<root>/bm25-<key>`, exposed as `index_path`. `built` tells whether this construction built the index (True)
    or loaded a cached one (False).
    """

    def __init__(self, passages: Sequence[Passage], index_dir: Optional[str | Path] = None,
                 show_progress: bool = True, stemming: bool = True):
        import bm25s

        if not passages:
            raise ValueError("BM25Retriever needs at least one passage")
        self.passages = list(passages)
        self._stemmer = _english_stemmer() if stemming else None
        stem_name = "snowball-english" if self._stemmer is not None else "none"
        key = cache_key(_FORMAT, corpus_fingerprint(self.passages), f"stopwords={_STOPWORDS}", f"stemmer={stem_name}")
        self.index_path = index_root(index_dir) / f"bm25-{key}"
        self._show_progress = show_progress
        start = time.perf_counter()
        self.built = build_once(self.index_path, self._build)
        self._bm25 = bm25s.BM25.load(str(self.index_path), mmap=False, load_corpus=False, show_progress=False)
        self.build_or_load_s = time.perf_counter() - start
        log.info("bm25 index %s %s in %.2fs (%d passages)", self.index_path,
                 "built" if self.built else "loaded", self.build_or_load_s, len(self.passages))

    def _tokenize(self, texts: list[str], show_progress: bool) -> list[list[str]]:
        import bm25s

        return bm25s.tokenize(texts, stopwords=_STOPWORDS, stemmer=self._stemmer, return_ids=False,
                              show_progress=show_progress)

    def _build(self, tmp: Path) -> None:
        import bm25s

        texts = [f"{p.title} {p.text}" for p in self.passages]
        tokens = self._tokenize(texts, self._show_progress)
        bm25 = bm25s.BM25()
        bm25.index(tokens, show_progress=self._show_progress)
        bm25.save(str(tmp), show_progress=False)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        k = hits_per_query(topk, len(self.passages))
        if not queries:
            return []
        tokens = self._tokenize(list(queries), show_progress=False)
        results: list[list[Hit]] = []
        # Thread-safe without a lock: scoring only reads the index arrays, and each call has its own buffers.
        for query_tokens in tokens:
            known = [t for t in query_tokens if t and t in self._bm25.vocab_dict]
            if known:
                scores = self._bm25.get_scores(known)
            else:  # no indexed word: every passage scores 0
                scores = np.zeros(len(self.passages), dtype=np.float32)
            results.append(self._top(scores, k))
        return results

    def _top(self, scores: np.ndarray, k: int) -> list[Hit]:
        """The k best passages by score, best first (ties by corpus order, so results are deterministic)."""
        n = len(scores)
        if k < n:
            kth = np.partition(scores, n - k)[n - k]  # the k-th largest score
            above = np.flatnonzero(scores > kth)
            tied = np.flatnonzero(scores == kth)[: k - len(above)]  # ties at the cut: earliest passages
            part = np.concatenate([above, tied])
        else:
            part = np.arange(n)
        order = part[np.lexsort((part, -scores[part]))]
        return [Hit(passage=self.passages[i], score=float(scores[i])) for i in order]
