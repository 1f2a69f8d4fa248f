"""drmas' on-disk build cache: where built artefacts live and how one is published without a half-written state.

Models imported or built once (the SmolLM2 import, primed tiny models) and retrieval indexes are directories
named after everything their content depends on, so reuse needs no staleness check. They are built in a
temporary sibling and renamed into place: `rename` is atomic on one filesystem, so readers see either nothing
or a complete directory, and processes racing to build the same one all end up using one copy.
(Torch-free, so light paths such as BM25 retrieval can use it.)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def cache_dir() -> Path:
    """Root of the cache: ``$DRMAS_CACHE`` if set (tests point it at a temp dir), else ~/.cache/drmas."""
    env = os.environ.get("DRMAS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "drmas"


def build_once(target: Path, build: Callable[[Path], None]) -> bool:
    """Make sure `target` exists, calling `build(tmp_dir)` to fill it first if it does not.

    Returns True when this call built the directory, False when an existing one (or a racing process's) is used.
    """
    if target.is_dir():
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # not a lost race: a real failure
                raise
            return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return True
