"""models.<id>.allocator: a learner process re-executes itself once with jemalloc preloaded, keeping its process
id and arguments, and says why where it cannot (drmas.learner.allocator)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from drmas.learner.allocator import EXEC_ENV, LIBRARY_ENV, jemalloc_library

PROBE = """
import os, sys
from drmas.learner.allocator import jemalloc_loaded, use_allocator
print("start", os.getpid(), jemalloc_loaded(), flush=True)
note = use_allocator(sys.argv[1])
print("after", os.getpid(), jemalloc_loaded(), os.environ.get("DRMAS_ALLOCATOR_EXEC", ""), sys.argv[1:], note)
"""


def _probe(allocator: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in (EXEC_ENV, LIBRARY_ENV, "LD_PRELOAD")}
    done = subprocess.run([sys.executable, "-c", PROBE, allocator, "--flag"], env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(jemalloc_library() is None or not sys.platform.startswith("linux"),
                    reason="libjemalloc is not installed (apt-get install libjemalloc2)")
def test_jemalloc_is_preloaded_by_one_re_execution_of_the_same_process():
    first, second, after = _probe("jemalloc")
    pid = first.split()[1]
    assert first == f"start {pid} False"
    assert second == f"start {pid} True"  # the same process, started again with jemalloc serving malloc
    assert after == f"after {pid} True 1 ['jemalloc', '--flag'] None"


def test_glibc_keeps_the_process_as_it_is():
    first, after = _probe("glibc")
    pid = first.split()[1]
    assert after == f"after {pid} False  ['glibc', '--flag'] None"


def test_a_missing_library_is_named_and_glibc_stays(tmp_path):
    missing = tmp_path / "libjemalloc.so.2"
    first, after = _probe("jemalloc", **{LIBRARY_ENV: str(missing)})
    assert after.startswith(f"after {first.split()[1]} False  ")
    assert f"{LIBRARY_ENV}='{missing}' is not a file" in after and "glibc's malloc stays" in after


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD is the Linux loader's")
def test_a_library_that_is_not_jemalloc_is_tried_once_then_named(tmp_path):
    """The loader ignores a preload it cannot load; the process goes on with glibc's malloc after one
    re-execution, and says which file did not serve."""
    fake = tmp_path / "not-jemalloc.so"
    fake.write_text("not an ELF file")
    first, second, after = _probe("jemalloc", **{LIBRARY_ENV: str(fake)})
    pid = first.split()[1]
    assert second == f"start {pid} False"
    assert after.startswith(f"after {pid} False 1 ") and f"'{fake}' was preloaded but does not serve malloc" in after

