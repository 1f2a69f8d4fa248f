"""Plugin code in a thread of the driver's, so a call that blocks costs a bounded wait, not the driver.

The episode runner hands every plugin call (an episode's step, a scripted reply, a service's batch) to `call`,
which runs it in a worker thread and waits for it until a deadline: one call at a time, in the driver's order,
so plugins see the calls they would see inline. The handoff is two locks, a few microseconds a call
(`bench/plugin_calls.py`). A call that is not back by its deadline raises `Stuck` with the stack where the
worker is; the worker is abandoned (a daemon thread, left to finish the call: its result is dropped and it
exits) and a fresh one takes the next call. `stuck` counts the abandoned workers still in their call.

A call waited for longer than `slow_after_s` (with more than that left to its deadline) is logged while the wait
goes on, with its stack the first time at each place, so a long bound does not mean a long silence. Without a deadline (`deadline=None`) a call runs in the caller's thread.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)

_EXIT = ("exit",)
_names = itertools.count()


class Stuck(Exception):
    """A plugin call did not return by its deadline; `stack` is where its (abandoned) thread was."""

    def __init__(self, stack: traceback.StackSummary) -> None:
        super().__init__("a plugin call did not return by its deadline")
        self.stack = stack


class _Worker:
    """One thread running the calls handed to it: `go` is released with a job, `done` when it is finished."""

    def __init__(self) -> None:
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.job: Any = None
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._serve, name=f"drmas-plugins-{next(_names)}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self.go.acquire()
            job, self.job = self.job, None
            if job is _EXIT:
                return
            fn, args = job
            try:
                self.result = fn(*args)
            except BaseException as exc:  # handed back to the caller, raised there
                self.error = exc
            self.done.release()

    def stop(self) -> None:
        """Exit once the call in progress (if any) is finished."""
        self.job = _EXIT
        try:
            self.go.release()
        except RuntimeError:  # released already: the thread has not taken its last job yet, it takes this one
            pass


class PluginThread:
    def __init__(self, slow_after_s: float = float("inf")) -> None:
        self.slow_after_s = slow_after_s
        self._worker: list[Optional[_Worker]] = [None]  # the current worker (a list: the finalizer shares it)
        self._abandoned: list[threading.Thread] = []
        self._slow: set[str] = set()  # where slow calls were: each one's stack is logged once
        weakref.finalize(self, _stop, self._worker)

    def call(self, fn: Callable[..., Any], *args: Any, deadline: Optional[float]) -> Any:
        """`fn(*args)`, run in the worker thread; `Stuck` if it is not back by `deadline` (time.monotonic()).
        An exception it raises is raised here."""
        if deadline is None:
            return fn(*args)
        worker = self._worker[0]
        if worker is None:
            worker = self._worker[0] = _Worker()
        worker.job = (fn, args)
        worker.go.release()
        try:
            done = self._wait(worker, deadline)
        except BaseException:  # a signal's KeyboardInterrupt: the call goes on without anyone waiting for it
            self._abandon(worker)
            raise
        if not done:
            stack = thread_stack(worker.thread)
            self._abandon(worker)
            raise Stuck(stack)
        result, error = worker.result, worker.error
        worker.result = worker.error = None
        if error is not None:
            raise error
        return result

    @property
    def stuck(self) -> int:
        """Abandoned calls still running in their threads."""
        self._abandoned = [thread for thread in self._abandoned if thread.is_alive()]
        return len(self._abandoned)

    def _wait(self, worker: _Worker, deadline: float) -> bool:
        if time.monotonic() + self.slow_after_s < deadline:
            if worker.done.acquire(timeout=self.slow_after_s):
                return True
            stack = thread_stack(worker.thread)
            place = where(stack)
            first = place not in self._slow
            self._slow.add(place)
            log.warning("a plugin call has been running for %.3g s (abandoned in %.3g s unless it returns), at %s%s",
                        self.slow_after_s, max(0.0, deadline - time.monotonic()), place,
                        ":\n" + "".join(stack.format()).rstrip() if first else "")
        return worker.done.acquire(timeout=max(0.0, deadline - time.monotonic()))

    def _abandon(self, worker: _Worker) -> None:
        worker.stop()
        self._worker[0] = None
        self._abandoned.append(worker.thread)


def _stop(slot: list[Optional[_Worker]]) -> None:
    if slot[0] is not None:
        slot[0].stop()


def thread_stack(thread: threading.Thread) -> traceback.StackSummary:
    """Where a worker's `thread` is now: the frames of the call it runs (below the worker's own)."""
    frame = sys._current_frames().get(thread.ident)  # type: ignore[arg-type]
    frames = traceback.extract_stack(frame) if frame is not None else traceback.StackSummary()
    ours = [i for i, f in enumerate(frames) if f.filename == __file__ and f.name == "_serve"]
    return traceback.StackSummary.from_list(frames[ours[-1] + 1:] if ours else frames)


def where(stack: traceback.StackSummary) -> str:
    """The innermost frame of `stack` in a plugin's code (the standard library's and the driver's frames skipped,
    when there are others): `file.py:line in function (source line)`."""
    if not stack:
        return "a built-in function"
    frame = next((f for f in reversed(stack) if not _ours_or_stdlib(f.filename)), stack[-1])
    name = frame.filename.rsplit("/", 1)[-1]
    return f"{name}:{frame.lineno} in {frame.name}" + (f" ({frame.line})" if frame.line else "")


_STDLIB = tuple({sysconfig.get_path(key) + os.sep for key in ("stdlib", "platstdlib")})
_PACKAGES = tuple({sysconfig.get_path(key) + os.sep for key in ("purelib", "platlib")})
_DRIVER = os.path.dirname(os.path.abspath(__file__)) + os.sep  # drmas/episodes, the driver


def _ours_or_stdlib(filename: str) -> bool:
    return filename.startswith(_DRIVER) or (filename.startswith(_STDLIB) and not filename.startswith(_PACKAGES))
