"""The Ray actor that hosts one pipeline process on whichever node Ray placed it: `ProcessHost`.

The actor does not run the buffer, learner or rollout in its own interpreter: it starts the same entry point
the local launcher starts (`python -m drmas.<role>.main --config ...`, a learner's ranks under torchrun) as
a child process and relays its output. That keeps one code path for every launcher (signals and a clean
stop on SIGTERM, exit codes, `process.log`, torchrun's rank handling all stay those of the process), and
lets the driver restart the process inside a living actor without Ray having to re-place it. The actor
holds the node's resources (CPUs, GPUs via `CUDA_VISIBLE_DEVICES`, which the child inherits) for the
process, finds free ports on its node, and writes the config (and the run's CURVE keys and plugin files) it
is given to a directory of its node before starting the child. The child is bound to the actor's life
(PR_SET_PDEATHSIG): an actor killed by Ray or lost with its worker takes its process with it, so a
restarted one never meets an orphan on its port.
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Optional

from drmas.launch.local import child_command, free_ports, popen_session, pump_lines
from drmas.launch.placement import localize
from drmas.runtime.process import die_with_parent


class ProcessHost:
    """One pipeline process on a Ray node (decorated with `ray.remote` by the driver)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"drmas-{name}-"))
        self.proc = None
        self.pump: Optional[threading.Thread] = None
        self.lines: collections.deque[str] = collections.deque()

    def where(self) -> tuple[str, int]:
        """(node address, actor pid)."""
        import ray

        return ray.util.get_node_ip_address(), os.getpid()

    def free_ports(self, host: str, count: int) -> list[int]:
        """`count` distinct ports free on this node for `host`."""
        return free_ports(host, count)

    def start(self, module: str, args: list[str], ranks: int, config_text: str, key_root: Optional[str],
              key_files: dict[str, str], cwd: str, plugins: Optional[dict[str, str]] = None) -> int:
        """Start the process (again) with the run's config written on this node; returns its pid."""
        config = localize(config_text, key_root, key_files, self.dir, plugins or {})
        command = child_command(sys.executable, module, str(config), args, ranks)
        self.proc = popen_session(command, cwd=cwd if os.path.isdir(cwd) else str(self.dir),
                                  preexec_fn=die_with_parent)  # not Linux: the actor's cleanup has to do
        self.pump = threading.Thread(target=pump_lines, args=(self.proc.stdout, self.lines.append), daemon=True)
        self.pump.start()
        return self.proc.pid

    def poll(self) -> tuple[list[str], Optional[int]]:
        """(output lines since the last poll, exit code or None while it runs)."""
        rc = self.proc.poll() if self.proc is not None else None
        if rc is not None and self.pump is not None:
            self.pump.join(timeout=5)  # its last lines
        lines = []
        while self.lines:
            lines.append(self.lines.popleft())
        return lines, rc

    def signal(self, sig: int) -> None:
        """Send `sig` to the process's group (a learner's torchrun and its ranks)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
