"""The retrieval interface shared by the search system, the retrieval server and its client.

A corpus row follows the common Wikipedia-dump layout used by Search-R1 style servers:
`{"id": ..., "contents": "title\\ntext"}`. `Passage` keeps the row's fields so that a server can answer
with the row unchanged; `title` and `text` are views on `contents`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Passage:
    id: str
    contents: str  # "title\ntext", as in the corpus file

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) > 1 else ""

    def row(self) -> dict:
        """The corpus row, as a retrieval server returns it."""
        return {"id": self.id, "contents": self.contents}


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


class Retriever(Protocol):
    """Top-k passages per query; the same object serves one process's episodes from several threads."""

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """For each query, its `topk` best passages, best first (fewer when the corpus is smaller)."""
        ...


def hits_per_query(topk: int, corpus_size: int) -> int:
    """How many hits a retriever returns per query: `topk`, or the whole corpus when it is smaller."""
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    return min(topk, corpus_size)
