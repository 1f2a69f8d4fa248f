"""The code-execution service of an orchestra: model-written Python in, one `SandboxResult` per program out.

`SandboxService` implements the orchestra service protocol (`drmas.mas.base.Service.call_batch`): the episode runner
hands it the programs of every episode waiting on it, and it runs them in parallel on `workers` worker slots
(each a thread watching one confined process tree; the rest of a batch waits for a free slot). Whatever a
program does (loops forever, allocates 10 GB, forks without end, crashes the interpreter, floods its
output) it costs that program's result, with a status saying which, never the caller: `call_batch` does not
raise for a program. What is confined and how: `drmas/tools/confine.py`; the statuses: `drmas.tools.outcome`.

The service runs a trivial program when it is made, so a sandbox that cannot work here (no way to cut the
network off while that is required, an interpreter that does not start) is one clear error before the
first episode, not a failed result per call.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence, Union

from drmas.config.sandbox import SandboxConfig
from drmas.tools.outcome import SandboxRequest, SandboxResult
from drmas.tools.process import run_program

log = logging.getLogger(__name__)

Request = Union[str, SandboxRequest]  # a bare string is a program with no other files


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run programs here as configured (raised when the service is made)."""


class SandboxService:
    """Orchestra service: a batch of programs (a str, or a SandboxRequest with other files) -> one SandboxResult
    each. Worker slot N runs its programs as uid `uid_base + N` when drmas runs as root."""

    def __init__(self, config: SandboxConfig, where: str = "sandbox") -> None:
        """`where`: the config key of `config` (e.g. ``system.sandbox``), named in every error."""
        problems = config.problems(where)
        if problems:
            raise ValueError("; ".join(problems))
        self.config = config
        self.where = where
        self._root = os.geteuid() == 0 and config.uid_base is not None
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        for slot in range(config.workers):
            self._slots.put(slot)
        self._closing = threading.Event()
        self._pool = ThreadPoolExecutor(config.workers, thread_name_prefix="drmas-sandbox")
        self.probe = self.run("pass")  # how programs are confined here (`probe.confinement`), or why they cannot run
        if not self.probe.ok:
            self.close()
            raise SandboxUnavailable(_unavailable(self.probe, where))
        isolated = self.probe.network != "none"
        (log.info if isolated else log.warning)(
            "%s: %d workers; %s; limits: %g s wall, %d s CPU, %d MiB, %d processes%s", where, config.workers,
            f"network cut off by {self.probe.network}" if isolated else "NOT isolated from the network",
            config.timeout_s, config.cpu_s, config.memory_mb, config.max_processes,
            "" if self.probe.confinement.get("process_limit") else " (NOT enforced: programs run as root)",
        )

    def call_batch(self, requests: Sequence[Request]) -> list[SandboxResult]:
        """One result per request, in order; the programs run in parallel up to `workers` at a time."""
        if self._closing.is_set():
            return [self.run(request) for request in requests]  # each 'killed' (or 'rejected'), nothing runs
        return list(self._pool.map(self.run, requests))

    def run(self, request: Request) -> SandboxResult:
        """Run one program on a free worker slot (waiting for one); never raises for the program or the
        request."""
        if isinstance(request, str):
            request = SandboxRequest(request)
        problems = request.problems() if isinstance(request, SandboxRequest) else [
            f"a request is a str (the program) or a SandboxRequest, got {type(request).__name__}"]
        if problems:
            return SandboxResult(status="rejected", detail="; ".join(problems))
        if self._closing.is_set():
            return SandboxResult(status="killed", detail="the sandbox service is closed")
        slot = self._slots.get()
        try:
            return run_program(request, self.config, self.config.uid_base + slot if self._root else None,
                               self._closing)
        except OSError as exc:  # the host, not the program: no temp space, out of file descriptors, ...
            log.warning("%s: a program could not be run: %s", self.where, exc)
            return SandboxResult(status="sandbox_error", detail=f"the sandbox could not run it: {exc}")
        finally:
            self._slots.put(slot)

    def close(self) -> None:
        """Kill the programs still running (their results say 'killed') and stop the workers."""
        self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> "SandboxService":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unavailable(probe: SandboxResult, where: str) -> str:
    text = f"{where}: the sandbox cannot run programs here: {probe.status}: {probe.detail}"
    if probe.stderr:
        text += "\n" + probe.stderr
    if probe.status == "sandbox_error" and "network" in probe.detail:
        text += (f" (set {where}.require_network_isolation: false to run programs with the network, or run where "
                 "namespaces or seccomp are available)")
    return text
