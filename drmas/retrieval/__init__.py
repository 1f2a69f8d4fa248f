"""Retrieval for the search system: BM25 and dense retrievers, a Search-R1 compatible server and client.

Importing this package is cheap (no index, model or torch import); the backends load on first use.
"""

from drmas.config.retrieval import RetrievalConfig
from drmas.retrieval.base import Hit, Passage, Retriever

__all__ = ["Hit", "Passage", "RetrievalConfig", "Retriever"]
