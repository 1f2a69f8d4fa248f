"""A weight push on a thread of its own, so that the learner goes on with its next batch meanwhile.

Before it sends, a push waits for every rollout to reach the end of its current generation step; after, for
each to apply the weights. On this 2-core machine that wait was a quarter of a tiny model's learner step
(`bench/staleness.py` on smoke_async: 0.11 s of 0.45 s, most of it the rollouts' step), and the learner
idled through it. On a GPU it is a decode step of a long batch. Nothing of the learner's next pull,
advantages or forward and backward passes needs the push to be over: only its next optimizer step does (it
changes the weights the push reads), and so does the buffer's version report (the buffer admits groups for
a version on the assumption that rollouts hold it). `ModelLane` waits for the push at those two points.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from drmas.weights import PushReport


class PushFailed(RuntimeError):
    """The push itself raised (its weight source failed), not a rollout: the learner cannot go on."""


class BackgroundPush:
    """One push (`push()`, a `WeightSender.push` call) running on a thread started at construction."""

    def __init__(self, push: Callable[[], PushReport], version: int) -> None:
        self.version = version
        self._report: PushReport | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(push,), name=f"drmas-push-v{version}", daemon=True)
        self._thread.start()

    def _run(self, push: Callable[[], PushReport]) -> None:
        try:
            self._report = push()
        except BaseException as exc:  # handed to the learner's thread by `wait`
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self) -> tuple[PushReport, float]:
        """The push's report once it is over, and the seconds this call waited for it; `PushFailed` if it
        raised."""
        start = time.monotonic()
        self._thread.join()
        waited = time.monotonic() - start
        if self._error is not None:
            raise PushFailed(f"the push of version {self.version} failed: {self._error!r}") from self._error
        assert self._report is not None
        return self._report, waited


class SharedConsumer:
    """A lane's `BufferConsumer`, shared by the lane's thread (pulls, drop reports) and its push thread (the
    version report, sent the moment every rollout holds the version): one call at a time (a ZeroMQ socket
    may change threads, never be used by two at once)."""

    def __init__(self, consumer) -> None:
        self._consumer = consumer
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        attr = getattr(self._consumer, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return locked
