"""What the sandbox is asked (`SandboxRequest`) and what it answers (`SandboxResult`), and how the way a program
ended becomes a status: the decisions, apart from the processes (`drmas.tools.process`) that produce the facts.

Statuses, one per result:
  ok            exit code 0
  error         another exit code (an uncaught exception: its traceback is in `stderr`)
  timeout       the wall-clock limit, or the CPU limit (RLIMIT_CPU: SIGXCPU, or SIGKILL past the hard limit)
  memory        an uncaught MemoryError (an allocation beyond RLIMIT_AS)
  crashed       killed by a fault signal (SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGSYS)
  killed        killed by another signal (e.g. the kernel's OOM killer, or the tool closing mid-run)
  output_limit  wrote more than `max_output_kb` to stdout and stderr: killed
  rejected      the request itself is malformed (e.g. a file name with a path in it): nothing ran
  sandbox_error the sandbox could not confine or start the program: nothing ran
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Mapping, Optional

STATUSES = ("ok", "error", "timeout", "memory", "crashed", "killed", "output_limit", "rejected", "sandbox_error")
MAIN = "main.py"  # the program's file in its working directory
# the keys of the launcher's report on how a program was confined (`SandboxResult.confinement`)
CONFINEMENT = ("network", "processes", "disk", "read_only_host", "proc", "uid", "process_limit")
_FAULTS = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGSYS}
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class SandboxRequest:
    """A program to run: `code` becomes ``main.py`` and runs as ``__main__``; `files` (name -> text) are written
    beside it first (the program may import them); the files named in `read_back` are returned in the result
    if the program left them there. Names are plain file names (no directories)."""

    code: str
    files: Mapping[str, str] = field(default_factory=dict)
    read_back: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        found = []
        if not isinstance(self.code, str):
            found.append(f"code must be a str, got {type(self.code).__name__}")
        for name in [*self.files, *self.read_back]:
            if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name) or name == MAIN:
                found.append(f"file name {name!r} is not a plain file name other than {MAIN}")
        found += [f"file {name!r}: content must be a str" for name, text in self.files.items()
                  if not isinstance(text, str)]
        return found


@dataclass
class SandboxResult:
    """How one program ended. `stdout`/`stderr` are the ends of the streams (`tail_chars` each); `network` says
    how the program was kept off the network ('netns', 'userns', 'seccomp', or 'none'). `cpu_s` and
    `max_rss_mb` cover the processes that were reaped: a program killed in its pid namespace may show less."""

    status: str
    exit_code: Optional[int] = None
    signal: Optional[str] = None  # e.g. "SIGSEGV", when a signal ended the program
    stdout: str = ""
    stderr: str = ""
    detail: str = ""  # one line on why the status, e.g. "wall-clock limit of 2 s"
    duration_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_mb: float = 0.0
    output_bytes: int = 0  # stdout + stderr bytes written (the tails may hold fewer)
    network: str = "none"
    confinement: dict = field(default_factory=dict)  # the launcher's report: network, processes, uid, process_limit
    files: dict[str, str] = field(default_factory=dict)  # the request's read_back files the program left

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass
class Facts:
    """What the process layer observed of one run: the launcher's status messages and the parent's own
    interventions (its backstop kill, the output cap)."""

    messages: dict = field(default_factory=dict)  # merged JSON status lines (drmas/tools/confine.py)
    output_limited: bool = False
    backstop_killed: bool = False  # the launcher itself outlived the limit and was killed from outside
    closing: bool = False  # the tool was closed during the run


def classify(facts: Facts, timeout_s: float, cpu_s: int, memory_mb: int, max_output_kb: int) -> tuple[str, str]:
    """(status, detail) of a finished run, from what was observed and the limits it ran under."""
    msg = facts.messages
    if facts.output_limited:
        return "output_limit", f"more than {max_output_kb} KiB of output"
    if msg.get("setup_error"):
        return "sandbox_error", str(msg["setup_error"])
    if msg.get("stopped") == "timeout" or facts.backstop_killed:
        return "timeout", f"wall-clock limit of {timeout_s:g} s"
    if facts.closing or msg.get("stopped"):
        return "killed", "the sandbox tool was closed during the run"
    if isinstance(msg.get("signal"), int):
        number = msg["signal"]
        name = _signal_name(number)
        if number == signal.SIGXCPU or (number == signal.SIGKILL and _float(msg.get("cpu_s")) >= cpu_s):
            return "timeout", f"CPU limit of {cpu_s} s ({name})"
        if number in _FAULTS:
            return "crashed", f"killed by {name}"
        return "killed", f"killed by {name}" + (" (the kernel's OOM killer?)" if number == signal.SIGKILL else "")
    if msg.get("uncaught") == "MemoryError":
        return "memory", f"MemoryError: memory limit of {memory_mb} MiB (address space)"
    if isinstance(msg.get("exit"), int):
        code = msg["exit"]
        return ("ok", "") if code == 0 else ("error", f"exit code {code}")
    return "sandbox_error", "the launcher ended without reporting how the program ended"



def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def signal_name(messages: dict) -> Optional[str]:
    """The name of the signal that ended the program, if one did."""
    number = messages.get("signal")
    return _signal_name(number) if isinstance(number, int) else None
