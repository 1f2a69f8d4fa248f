"""Build the configured retriever (`retrieval.*` keys) for a task: what `drmas.assembly.build_orchestra` calls.

The corpus is `retrieval.corpus` when set, else the task's own passages (the generated multi-hop world has
them); the http backend needs neither, since the server holds its corpus.
"""

from __future__ import annotations

from typing import Optional

from drmas.errors import naming_key
from drmas.retrieval.base import Passage, Retriever
from drmas.retrieval.config import RetrievalConfig

BACKENDS = ("bm25", "dense", "http")


def validate_retrieval_config(cfg: RetrievalConfig, prefix: str = "retrieval") -> None:
    """Raise ValueError naming the first impossible `retrieval.*` value."""
    if cfg.backend not in BACKENDS:
        raise ValueError(f"{prefix}.backend: {cfg.backend!r} is not one of {', '.join(BACKENDS)}")
    if isinstance(cfg.topk, bool) or not isinstance(cfg.topk, int) or cfg.topk < 1:
        raise ValueError(f"{prefix}.topk: must be an integer >= 1, got {cfg.topk!r}")
    if isinstance(cfg.batch_size, bool) or not isinstance(cfg.batch_size, int) or cfg.batch_size < 1:
        raise ValueError(f"{prefix}.batch_size: must be an integer >= 1, got {cfg.batch_size!r}")
    for key in ("retries", "max_queries_per_request"):
        value, least = getattr(cfg, key), 0 if key == "retries" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{prefix}.{key}: must be an integer >= {least}, got {value!r}")
    if not cfg.timeout_s > 0:
        raise ValueError(f"{prefix}.timeout_s: must be > 0, got {cfg.timeout_s!r}")
    if cfg.backend == "http" and not str(cfg.url).startswith(("http://", "https://")):
        raise ValueError(f"{prefix}.url: must be an http:// or https:// URL, got {cfg.url!r}")


def corpus_for(cfg: RetrievalConfig, task: Optional[object]) -> list[Passage]:
    """`retrieval.corpus` loaded, else `task.passages()`; ValueError when neither exists."""
    if cfg.corpus:
        from drmas.retrieval.corpus import load_passages

        try:
            return load_passages(cfg.corpus)
        except (FileNotFoundError, ValueError) as exc:  # name the key as well as the file and line
            raise naming_key("retrieval.corpus", exc) from exc
    passages = getattr(task, "passages", None)
    if callable(passages):
        return list(passages())
    name = getattr(task, "name", type(task).__name__ if task is not None else None)
    raise ValueError(
        f"retrieval.corpus must be set: the task {name!r} provides no passages of its own "
        f"(give a passages jsonl, or use the generated multi-hop world task)")


def build_retriever(cfg: RetrievalConfig, task: Optional[object] = None, show_progress: bool = True) -> Retriever:
    """The retriever `cfg` describes, over `cfg.corpus` or the task's passages."""
    validate_retrieval_config(cfg)
    if cfg.backend == "http":
        from drmas.retrieval.client import HttpRetriever

        return HttpRetriever(cfg.url, timeout_s=cfg.timeout_s, retries=cfg.retries,
                             max_queries_per_request=cfg.max_queries_per_request)
    passages = corpus_for(cfg, task)
    if cfg.backend == "bm25":
        from drmas.retrieval.bm25 import BM25Retriever

        return BM25Retriever(passages, index_dir=cfg.index_dir, show_progress=show_progress)
    from drmas.retrieval.dense import DenseRetriever

    return DenseRetriever(passages, model_dir=cfg.dense_model, index_dir=cfg.index_dir,
                          batch_size=cfg.batch_size, show_progress=show_progress)
