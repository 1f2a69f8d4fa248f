"""A pipeline process notices that the launcher that started it is gone, and stops.

The local launcher starts the buffer, the learners and the rollouts each in a session of its own (so that it
can signal each one's whole group), which also means a SIGKILL of `drmas run` reaches none of them: they
lived on as orphans, holding ports, devices and a half-finished run, until killed by hand. A parent-death
signal does not fit: the kernel ties it to the parent *thread*, and it would not reach a learner's ranks
under torchrun, whose parent is torchrun. So the launcher names itself in the environment
(`DRMAS_LAUNCHER=<pid>:<start time>`, inherited by every descendant, torchrun's ranks included) and each
process watches that process: when it is gone, or its pid now belongs to another process (same pid, other
start time), the process stops as SIGTERM would make it -- rollouts stop generating, a learner writes its
checkpoint, the buffer closes -- and is killed if that takes longer than `grace_s`.

The decision (`launcher_alive`) reads /proc and nothing else; the thread around it only polls and acts.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Optional

log = logging.getLogger(__name__)

LAUNCHER_ENV = "DRMAS_LAUNCHER"
POLL_S = 1.0
GRACE_S = 120.0  # a learner's checkpoint of a large model takes a while; the launcher's own grace is 60 s


def _stat(pid: int) -> Optional[tuple[str, str]]:
    """(state, start time in clock ticks since boot) of a process: fields 3 and 22 of /proc/<pid>/stat; None if
    there is no such process. The command name (field 2) may hold spaces and parentheses: split after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def launcher_identity(pid: Optional[int] = None) -> str:
    """What a child needs to recognise process `pid` (this one by default) later: '<pid>:<start time>'."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    return f"{pid}:{stat[1] if stat else ''}"


def launcher_env() -> dict[str, str]:
    """The environment entry a launcher hands every process it starts."""
    return {LAUNCHER_ENV: launcher_identity()}


def launcher_alive(identity: str) -> bool:
    """Whether the process `identity` names still runs (a zombie, dead but not reaped, counts as gone)."""
    pid_text, _, started = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return True  # not ours to judge: never stop a process on a malformed variable
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z" and (not started or stat[1] == started)


class LauncherWatch:
    """Polls the launcher named in the environment; when it is gone, sets `stop` and, past `grace_s`, kills
    this process. Does nothing for a process started by hand (no variable)."""

    def __init__(self, stop, identity: Optional[str] = None, poll_s: float = POLL_S, grace_s: float = GRACE_S):
        self.stop = stop
        self.identity = os.environ.get(LAUNCHER_ENV, "") if identity is None else identity
        self.poll_s, self.grace_s = poll_s, grace_s
        self.thread: Optional[threading.Thread] = None

    def start(self) -> "LauncherWatch":
        if self.identity and self.thread is None:
            self.thread = threading.Thread(target=self._run, name="drmas-launcher-watch", daemon=True)
            self.thread.start()
        return self

    def _run(self) -> None:
        while launcher_alive(self.identity):
            if self.stop.wait(self.poll_s):
                return  # stopping anyway
        pid = self.identity.partition(":")[0]
        log.warning("the launcher that started this process (pid %s) is gone: stopping at the next safe point "
                    "(killed if not stopped in %.0f s)", pid, self.grace_s)
        self.stop.signal_name = "the launcher's death"
        self.stop.set()
        threading.Event().wait(self.grace_s)
        log.error("still running %.0f s after the launcher died: killing this process", self.grace_s)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def watch_launcher(stop) -> LauncherWatch:
    """Start watching the launcher of this process (see the module docstring)."""
    return LauncherWatch(stop).start()
