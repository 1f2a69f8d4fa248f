"""Where retrieval indexes are cached, and how a built index is published without a half-written state.

An index directory is named after everything its content depends on (corpus fingerprint, backend settings,
format version), so reuse needs no staleness check: the same name means the same index. Directories are
published atomically by `drmas.core.cache.build_once`.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

from drmas.core.cache import build_once, cache_dir

__all__ = ["build_once", "cache_key", "index_root"]


def index_root(index_dir: Optional[str | os.PathLike] = None) -> Path:
    """`index_dir` if given, else `<$DRMAS_CACHE or ~/.cache/drmas>/indexes`."""
    if index_dir is not None:
        return Path(index_dir).expanduser()
    return cache_dir() / "indexes"


def cache_key(*parts: str) -> str:
    """A short hex key naming an index built from `parts` (fingerprints and settings)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:24]
