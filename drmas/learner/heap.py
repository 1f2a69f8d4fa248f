"""A learner process's C heap under glibc's malloc: freed tensor memory goes back to the system at once.

A learner uses this where jemalloc does not serve it (`models.<id>.allocator: glibc`, or the library missing:
`drmas.learner.allocator`, which gets both the speed of glibc's default heap and the peak of the threshold).

Why: glibc's malloc serves a request below its mmap threshold from its heap, and raises that threshold (up
to 32 MiB) every time a larger mapped block is freed. The tensors of a training pass are a few MB each (one
hidden state of 8 x 600 tokens x 576 floats is 11 MB), so after the first pass nearly all of them come from
the heap, whose freed memory stays with the process, in holes that the next pass's tensors only partly fit:
the learner's resident memory grew with every update and reached its live tensors plus 1.3 GB (quick
start) to 2.3 GB (search quick start) with SmolLM2-135M (docs/memory.md). A fixed threshold
(`models.<id>.heap_mmap_threshold_kb`) gives every block at or above it a mapping of its own, unmapped when
freed, so the resident memory follows the live tensors. What it costs is the page faults of fresh mappings:
about a quarter more CPU time per update on CPU, measured on a 2-core VM (bench/memory.py prints it). On a
GPU the tensors live in CUDA's caching allocator and the host heap holds little.

Measured alternatives that did not bound the peak: `malloc_trim(0)` after every backward or update, and
gradients kept allocated between steps (the heap's holes stay, so the peak still grew by 0.7-1 GB).

`MALLOC_MMAP_THRESHOLD_` in the environment wins (glibc reads it at start; nothing is changed then). On a C
library without glibc's `mallopt` options (musl, macOS) nothing changes either.

Huge pages (`models.<id>.huge_pages`) take back about half of what the fresh mappings cost: PyTorch's CPU allocator,
told by `THP_MEM_ALLOC_ENABLE`, page-aligns every tensor of 2 MiB or more and advises the kernel to back it
with 2 MiB transparent huge pages, so a mapping faults in per 2 MiB instead of per 4 KiB (bench/update_heap.py:
the threshold's update 1.31x glibc's default without, 1.16x with, at the same peak; docs/memory.md). Not all of
it: a mapping starts on a 4 KiB page, not a 2 MiB one, so only the whole 2 MiB pages inside it are huge (56% of
a 4.8 MB tensor, 83% of a 12.8 MB one, measured), and the rest faults in as before. The
allocator reads the variable once, at its first allocation, so `advise_huge_pages` runs before the process
allocates any tensor. It changes nothing where the kernel's THP mode is `never`, and `always` gives it already.
"""

from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
ENV = "MALLOC_MMAP_THRESHOLD_"
THP_ENV = "THP_MEM_ALLOC_ENABLE"  # PyTorch's CPU allocator (c10/core/impl/alloc_cpu.cpp)


def map_large_blocks(threshold_kb: int) -> bool:
    """Serve every allocation of `threshold_kb` KiB or more from a mapping of its own, for the rest of this
    process (0: leave malloc as it is); True when the C library took the setting."""
    if threshold_kb <= 0 or ENV in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    taken = bool(mallopt(M_MMAP_THRESHOLD, threshold_kb * 1024))
    log.info("malloc: blocks of %d KiB or more are mapped on their own%s", threshold_kb,
             "" if taken else " (refused by the C library)")
    return taken


def advise_huge_pages(enabled: bool) -> None:
    """Have PyTorch's CPU allocator ask for transparent huge pages for every tensor of 2 MiB or more, for the
    rest of this process. Call it before the process's first tensor allocation (the allocator reads the setting
    once); `THP_MEM_ALLOC_ENABLE` already in the environment wins."""
    if enabled and THP_ENV not in os.environ:
        os.environ[THP_ENV] = "1"


def huge_pages_in_effect() -> bool:
    """Whether this process's tensors of 2 MiB or more are page-aligned and advised huge pages: PyTorch aligns
    them to 64 bytes otherwise, so two 4 MiB probes both on a page boundary tell (a chance of 1 in 4096 to
    be wrong where glibc's heap serves them, none where each block is mapped)."""
    import torch

    page = os.sysconf("SC_PAGESIZE")
    probes = [torch.empty(1 << 20) for _ in range(2)]
    return all(t.data_ptr() % page == 0 for t in probes)
