"""Helpers of the sandbox tests: the limits they share, a work root every user may search and services made
under it, the interpreter the seccomp fallback can run as root, the wrapper that runs a service's launcher as an
unprivileged user, and the check that a finished run left no process and no working directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from drmas.config.sandbox import SandboxConfig
from drmas.tools import SandboxService

# A wall clock that no program of a test runs into unless it is meant to: one that must (an endless loop, a
# fork bomb, a sleep) runs in a service with SHORT_TIMEOUT_S; with that limit for every program, a loaded machine
# starting Python slowly could time out one that should have ended.
LIMITS = dict(timeout_s=30.0, cpu_s=5, memory_mb=256, max_processes=8, max_output_kb=64, max_file_mb=1,
              max_disk_mb=4, max_open_files=32, workers=4, tail_chars=2000)
SHORT_TIMEOUT_S = 1.5
IS_ROOT = os.geteuid() == 0
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
UNPRIVILEGED = bool(shutil.which("setpriv")) and os.path.exists(SYSTEM_PYTHON)


@contextlib.contextmanager
def searchable_root() -> Iterator[Path]:
    """A fresh directory in the system's temp directory (the default `tmp_dir`) that every user may search:
    without a mount namespace, as root, the program's uid must reach its working directory by its path
    (pytest's own temp directories are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="drmas-sandbox-tests-"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_service(work_root: Path, name: str, **changes) -> SandboxService:
    root = work_root / name
    root.mkdir(exist_ok=True)
    return SandboxService(SandboxConfig(**{**LIMITS, "tmp_dir": str(root), **changes}), where=f"test.{name}")


def readable_by_others(path: str) -> bool:
    """Whether a user of no group of the owner's can list `path` and reach it (every parent searchable)."""
    path = os.path.realpath(path)
    if os.stat(path).st_mode & 0o5 != 0o5:
        return False
    while path != "/":
        path = os.path.dirname(path)
        if not os.stat(path).st_mode & 0o1:
            return False
    return True


def fallback_python() -> Optional[str]:
    """The interpreter for the seccomp fallback as root: without a mount namespace the program's uid reads only
    what every user may, so one under /root (a pyenv) cannot run there; null where this one is readable."""
    if not IS_ROOT or all(readable_by_others(p) for p in (sys.base_prefix, sys.prefix)):
        return None
    return SYSTEM_PYTHON


def nobody_python(directory: Path) -> str:
    """A wrapper interpreter that hands the working directory to uid 65534 and starts the system Python as it
    (another user may not read ours)."""
    wrapper = directory / "python-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nchown -R {NOBODY}:{NOBODY} .\n"
                       f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {SYSTEM_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def leftovers(service: SandboxService) -> list[int]:
    """Processes whose working directory is under the service's tmp_dir (a run's directory, deleted or not)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd").startswith(service.config.tmp_dir):
                    found.append(int(name))
            except OSError:
                pass
    return found


def assert_nothing_left(service: SandboxService) -> None:
    assert leftovers(service) == [], "a process of a finished run is still alive"
    assert os.listdir(service.config.tmp_dir) == [], "a working directory was not removed"
