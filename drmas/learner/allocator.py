"""A learner process's malloc: jemalloc where the system has it, made so by re-executing the process once.

Why (issue 37, measured on SmolLM2-135M, docs/memory.md): glibc's malloc gives a learner either speed or a
bounded peak, never both. Its default heap keeps freed tensor memory in holes the next pass only partly fits
(quick start: peak 3.52 GB, 1.63x the floor); a fixed mmap threshold (`heap_mmap_threshold_kb`,
`drmas.learner.heap`) maps every large tensor afresh, so every pass faults its pages in again (update 1.16x
slower even with huge pages). jemalloc reuses freed extents within a pass and hands them back to the system
after seconds of disuse, so it has both: `bench/memory.py` on the quick start's samples, update 51.3 and 43.9 s
(glibc's default heap 50.9 and 42.1 s, the threshold 60.1 and 49.6 s) at a peak of 3.32 GB (threshold 3.30 GB).

A malloc takes over from glibc's only if it is loaded before the process's first allocation, so a learner that
asks for it (`models.<id>.allocator: jemalloc`, the default) re-executes itself at its start, before it imports
torch, with the library first in `LD_PRELOAD`: same interpreter, arguments and process id (a launcher or
torchrun watching it sees nothing). `DRMAS_ALLOCATOR_EXEC` marks the second start, so it happens once even if
the library could not be preloaded. Where jemalloc is missing (`apt-get install libjemalloc2`; or
`DRMAS_JEMALLOC=/path/to/libjemalloc.so`) or the system is not Linux, the learner says so and keeps glibc's malloc
with `heap_mmap_threshold_kb`. Children of the learner inherit the preload; jemalloc serves them as well.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

LIBRARY_ENV = "DRMAS_JEMALLOC"  # a path to the library, for one outside the dynamic loader's search
EXEC_ENV = "DRMAS_ALLOCATOR_EXEC"  # set on the re-executed process


def jemalloc_loaded() -> bool:
    """Whether jemalloc serves this process's malloc (its control interface is in the global namespace)."""
    return hasattr(ctypes.CDLL(None), "mallctl")


def jemalloc_library() -> str | None:
    """`DRMAS_JEMALLOC` when set and a file; else the soname the dynamic loader finds (libjemalloc.so.2); None."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return explicit if os.path.isfile(explicit) else None
    return ctypes.util.find_library("jemalloc")


def use_allocator(name: str) -> str | None:
    """Make `name` this process's malloc. For jemalloc not yet loaded this re-executes the process with it
    preloaded and does not return; call it before the process allocates much (before torch is imported).
    Returns a line for the log when the process goes on with glibc's malloc although `name` asked otherwise."""
    if name != "jemalloc" or jemalloc_loaded():
        return None
    if not sys.platform.startswith("linux"):
        return "jemalloc: preloading is for Linux; glibc's (the system's) malloc stays"
    if os.environ.get(EXEC_ENV):
        return (f"jemalloc: {os.environ.get('LD_PRELOAD', '')!r} was preloaded but does not serve malloc "
                f"(not a jemalloc library?); glibc's malloc stays")
    library = jemalloc_library()
    if library is None:
        where = f"{LIBRARY_ENV}={os.environ[LIBRARY_ENV]!r} is not a file" if os.environ.get(LIBRARY_ENV) else \
            f"libjemalloc not found (apt-get install libjemalloc2, or set {LIBRARY_ENV} to its path)"
        return f"jemalloc: {where}; glibc's malloc stays, with models.<id>.heap_mmap_threshold_kb"
    preload = ":".join(p for p in (library, os.environ.get("LD_PRELOAD", "")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
              {**os.environ, "LD_PRELOAD": preload, EXEC_ENV: "1"})
    return None  # not reached
