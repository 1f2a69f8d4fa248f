"""Helpers of the sandbox tests: the limits they share, tools made under one work root, the wrapper that runs
a tool's launcher as an unprivileged user, and the check that a finished run left no process and no working
directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from drmas.config.sandbox import SandboxConfig
from drmas.tools import SandboxTool

LIMITS = dict(timeout_s=1.5, cpu_s=5, memory_mb=256, max_processes=8, max_output_kb=64, max_file_mb=1,
              max_disk_mb=4, max_open_files=32, workers=4, tail_chars=2000)
IS_ROOT = os.geteuid() == 0
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
UNPRIVILEGED = bool(shutil.which("setpriv")) and os.path.exists(SYSTEM_PYTHON)


def make_tool(work_root: Path, name: str, **changes) -> SandboxTool:
    root = work_root / name
    root.mkdir(exist_ok=True)
    return SandboxTool(SandboxConfig(**{**LIMITS, "tmp_dir": str(root), **changes}), where=f"test.{name}")


def nobody_python(directory: Path) -> str:
    """A wrapper interpreter that hands the working directory to uid 65534 and starts the system Python as it
    (another user may not read ours)."""
    wrapper = directory / "python-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nchown -R {NOBODY}:{NOBODY} .\n"
                       f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups {SYSTEM_PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def leftovers(tool: SandboxTool) -> list[int]:
    """Processes whose working directory is under the tool's tmp_dir (a run's directory, deleted or not)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/cwd").startswith(tool.config.tmp_dir):
                    found.append(int(name))
            except OSError:
                pass
    return found


def assert_nothing_left(tool: SandboxTool) -> None:
    assert leftovers(tool) == [], "a process of a finished run is still alive"
    assert os.listdir(tool.config.tmp_dir) == [], "a working directory was not removed"
