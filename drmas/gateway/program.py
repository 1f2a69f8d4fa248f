"""The agent program of the external system: started for a rollout, restarted when it dies, stopped with it.

The program runs in a process group of its own, so stopping it (SIGTERM, then SIGKILL after `stop_timeout_s`)
reaches whatever it started too. It is bound to the rollout's life by the kernel (PR_SET_PDEATHSIG, as the Ray
host binds its processes): a rollout that is SIGKILLed takes the program with it, and a restarted rollout never
meets an orphan calling a gateway that is gone. The kernel ties that signal to the thread that started the
program, so `start` and `check` run in the driver thread, which lives as long as the rollout.

When the program exits, `check` (called every round by the driver) reports it (`on_exit`: its episodes in
flight are dropped) and restarts it after a doubling backoff, at most `max_restarts` times, with the launchers'
policy (`drmas.runtime.restarts`: exit code 2, a bad command line, is not retried). Past that it raises
`ProgramFailed`, which ends the rollout's run.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from drmas.config.restarts import RestartConfig
from drmas.core.errors import Fatal
from drmas.runtime.process import die_with_parent
from drmas.runtime.restarts import RestartBook

log = logging.getLogger(__name__)

NAME = "the agent program (system.command)"


class ProgramFailed(Fatal):
    """The program kept dying (or cannot run): the rollout cannot produce episodes."""


def resolve_command(command: Sequence[str], workdir: str) -> tuple[list[str], Path]:
    """The argument list to run (a first word `python` is the interpreter drmas runs on) and the working
    directory; ValueError naming the key when the directory or the executable does not exist."""
    cwd = Path(workdir or ".").resolve()
    if not cwd.is_dir():
        raise ValueError(f"system.workdir: {workdir!r} is not a directory ({cwd})")
    argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    exe = argv[0]
    found = shutil.which(exe, path=str(cwd)) if os.sep in exe else shutil.which(exe)
    if os.sep in exe and found is None:
        found = str(cwd / exe) if os.access(cwd / exe, os.X_OK) else None
    if found is None:
        raise ValueError(f"system.command: cannot run {exe!r}: no such executable "
                         f"({'relative to ' + str(cwd) if os.sep in exe else 'on PATH'})")
    return argv, cwd


class AgentProgram:
    """One supervised program (see the module docstring)."""

    def __init__(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str], restarts: RestartConfig,
                 stop_timeout_s: float, on_exit: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.argv, self.cwd, self.env = list(argv), cwd, dict(env)
        self.stop_timeout_s = stop_timeout_s
        self.on_exit = on_exit
        self._book = RestartBook(restarts, where="system")
        self._clock = clock
        self._proc: Optional[subprocess.Popen] = None
        self._due: Optional[float] = None  # when the next start is due (None: running or stopped)
        self.starts = 0

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    @property
    def restarts(self) -> int:
        return max(self.starts - 1, 0)

    def start(self) -> None:
        try:
            self._proc = subprocess.Popen(self.argv, cwd=self.cwd, env=self.env, start_new_session=True,
                                          preexec_fn=die_with_parent)  # noqa: PLW1509  (bound to this thread)
        except OSError as exc:
            raise ProgramFailed(f"system.command: cannot start {self.argv}: {exc}") from None
        self.starts += 1
        self._due = None
        log.info("started %s: %s (pid %d, in %s)", NAME, " ".join(self.argv), self._proc.pid, self.cwd)

    def check(self) -> None:
        """Notice an exit (report it, plan the restart) and restart when due; ProgramFailed past the bound."""
        if self._proc is None:
            if self._due is not None and self._clock() >= self._due:
                self.start()
            return
        code = self._proc.poll()
        if code is None:
            return
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        pid, self._proc = self._proc.pid, None
        self._stop_group(pid)  # what it started goes with it
        self.on_exit(f"{NAME} (pid {pid}) {how}")
        decision = self._book.after_exit(NAME, code)
        if not decision.restart:
            raise ProgramFailed(decision.why)
        log.warning("%s (pid %d) %s; restart %d of %d in %.1f s", NAME, pid, how, decision.attempt,
                    self._book.config.max_restarts, decision.delay_s)
        self._due = self._clock() + decision.delay_s

    def stop(self) -> None:
        """SIGTERM the program's group, SIGKILL it after `stop_timeout_s`; no restart after this."""
        self._due = None
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._signal(proc.pid, signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %.0f s: killing it", NAME, proc.pid, self.stop_timeout_s)
        self._stop_group(proc.pid)
        proc.wait()

    def _stop_group(self, pid: int) -> None:
        self._signal(pid, signal.SIGKILL)

    @staticmethod
    def _signal(pgid: int, sig: int) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
