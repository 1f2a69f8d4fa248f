"""Reading a passages corpus, and the fingerprint that keys its cached indexes.

Corpora come as jsonl dumps of Wikipedia-style passages. Search-R1 style dumps hold
`{"id": ..., "contents": "title\\ntext"}` per line; other dumps split the two as `{"id", "title", "text"}`. Both
become `Passage(id, contents="title\\ntext")`. A corrupt line is reported with the file and its 1-based line
number, because a multi-gigabyte dump is otherwise impossible to fix. Index caches are keyed by
`corpus_fingerprint`, a hash of the passages' ids and contents in order, so an edited corpus never reuses a
stale index whatever its file name or modification time.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Optional

import msgspec

from drmas.core.jsonl import input_file, jsonl_records
from drmas.retrieval.base import Passage


class CorpusError(ValueError):
    """A corpus file (or a retrieval server's answer) holds a row that is not a passage."""


def passage_from_row(row: object, where: str, require_id: bool = True) -> Passage:
    """One corpus row as a Passage; `where` ("file:line") prefixes any error.

    Accepts `contents` ("title\\ntext") or `title` + `text`; an integer id is kept as its decimal string.
    """
    if not isinstance(row, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(row).__name__}")
    pid = row.get("id")
    if pid is None:
        if require_id:
            raise CorpusError(f"{where}: missing field 'id'")
        pid = ""
    elif isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise CorpusError(f"{where}: field 'id' must be a string or an integer, got {type(pid).__name__}")
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            raise CorpusError(f"{where}: field 'contents' must be a string, got {type(contents).__name__}")
    elif "title" in row or "text" in row:
        for key in ("title", "text"):
            if key not in row:
                raise CorpusError(f"{where}: has no 'contents', and '{key}' is missing beside the other of 'title'/'text'")
            if not isinstance(row[key], str):
                raise CorpusError(f"{where}: field '{key}' must be a string, got {type(row[key]).__name__}")
        contents = f"{row['title']}\n{row['text']}"
    else:
        raise CorpusError(f"{where}: missing field 'contents' (or 'title' and 'text')")
    return Passage(id=str(pid), contents=contents)


def load_passages(path: str | Path, limit: Optional[int] = None) -> list[Passage]:
    """The passages of a jsonl corpus file, in file order (blank lines are skipped).

    Raises FileNotFoundError for a missing file, CorpusError for a directory or an unreadable file, and
    CorpusError naming the file and the 1-based line number of
    the first corrupt line (bad JSON, missing or mistyped field, duplicate id), or when the file holds no passage.
    """
    path = input_file(path, "corpus file", CorpusError)
    passages: list[Passage] = []
    first_line_of: dict[str, int] = {}
    for where, lineno, row in jsonl_records(path, CorpusError):
        passage = passage_from_row(row, where)
        if passage.id in first_line_of:
            raise CorpusError(f"{where}: duplicate id {passage.id!r} (first seen on line {first_line_of[passage.id]})")
        first_line_of[passage.id] = lineno
        passages.append(passage)
        if limit is not None and len(passages) >= limit:
            break
    if not passages:
        raise CorpusError(f"{path}: the corpus file holds no passages")
    return passages


def write_passages(passages: Iterable[Passage], path: str | Path) -> Path:
    """Write passages as a Search-R1 style jsonl corpus (`{"id", "contents"}` per line)."""
    path = Path(path)
    encoder = msgspec.json.Encoder()
    with path.open("wb") as f:
        for p in passages:
            f.write(encoder.encode(p.row()))
            f.write(b"\n")
    return path


def corpus_fingerprint(passages: Iterable[Passage]) -> str:
    """A stable hex digest of the passages' ids and contents, in order (the key of their cached indexes)."""
    h = hashlib.sha256()
    n = 0
    for p in passages:
        for part in (p.id, p.contents):
            data = part.encode("utf-8")
            h.update(len(data).to_bytes(8, "little"))
            h.update(data)
        n += 1
    h.update(n.to_bytes(8, "little"))
    return h.hexdigest()
