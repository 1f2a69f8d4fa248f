"""Build the configured retriever (`retrieval.*` keys) for a task: what `drmas.assembly.build_orchestra` calls.

`RETRIEVERS` maps `retrieval.backend` to a factory `(cfg, task, show_progress) -> Retriever`; the built-ins
register below and import their heavy dependencies only when chosen, and a plugin registers its own the
same way. The corpus is `retrieval.corpus` when set, else the task's own passages (the generated multi-hop
world has them); the http backend needs neither, since the server holds its corpus.
"""

from __future__ import annotations

from typing import Callable, Optional

from drmas.config.retrieval import RetrievalConfig
from drmas.core.errors import naming_key
from drmas.core.registry import Registry
from drmas.retrieval.base import Passage, Retriever

RetrieverFactory = Callable[[RetrievalConfig, Optional[object], bool], Retriever]
RETRIEVERS: Registry[RetrieverFactory] = Registry("retriever")


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
    cfg.validate("retrieval")
    return RETRIEVERS.lookup(cfg.backend, "retrieval.backend")(cfg, task, show_progress)


@RETRIEVERS.register("http")
def _http(cfg: RetrievalConfig, task: Optional[object], show_progress: bool) -> Retriever:
    from drmas.retrieval.client import HttpRetriever

    return HttpRetriever(cfg.url, timeout_s=cfg.timeout_s, retries=cfg.retries,
                         max_queries_per_request=cfg.max_queries_per_request)


@RETRIEVERS.register("bm25")
def _bm25(cfg: RetrievalConfig, task: Optional[object], show_progress: bool) -> Retriever:
    from drmas.retrieval.bm25 import BM25Retriever

    return BM25Retriever(corpus_for(cfg, task), index_dir=cfg.index_dir, show_progress=show_progress)


@RETRIEVERS.register("dense")
def _dense(cfg: RetrievalConfig, task: Optional[object], show_progress: bool) -> Retriever:
    from drmas.retrieval.dense import DenseRetriever

    return DenseRetriever(corpus_for(cfg, task), model_dir=cfg.dense_model, index_dir=cfg.index_dir,
                          batch_size=cfg.batch_size, show_progress=show_progress)
