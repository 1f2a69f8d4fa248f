"""What a failing plugin costs: its episode, not the process.

Plugins (orchestras, services, scripted agents, the rewards an orchestra returns) are user code running inside
the long-running processes, so one that raises on one episode must not end a rollout (or the colocated run).
The episode runner turns such an exception into an `EpisodeFailure` and drops that episode; the `FailureBook`
here logs it once (the traceback only with the first occurrence of each distinct error, so a recurring bug
does not flood the log), counts it, and tells a bug that fails every episode from a bad input: after
`limit` failures in a row with no episode ending well it raises `EpisodeFailures`, naming the plugin and the
exception, instead of letting the process spin without producing anything. A `drmas.core.errors.Fatal`
(e.g. an agent program past its restart bound) is not one episode's failure: it goes through. An episode past
one of its bounds (`drmas.episodes.bounds.OverBound`) is dropped the same way, counted per reason, and logged with
where its plugin was instead of a traceback.

One traceback per distinct error, and only that error's: a service's batch that raised is retried one request at a
time outside its exception handler, so a request's own error does not carry the batch's as its context.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from drmas.core.errors import Fatal
from drmas.episodes.bounds import OverBound

if TYPE_CHECKING:
    from drmas.episodes import EpisodeRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeFailure:
    """Why an episode was dropped: which plugin (`kind` orchestra, service or scripted agent, and its `name`)
    raised what, at which agent or service (`at`, may be empty)."""

    request: EpisodeRequest
    kind: str
    name: str
    at: str
    error: BaseException

    def describe(self) -> str:
        at = f" at {self.at}" if self.at else ""
        return (f"{self.kind} {self.name!r}{at} failed in episode {self.request.episode_id}: "
                f"{type(self.error).__name__}: {self.error}")


class EpisodeFailures(RuntimeError):
    """Every recent episode failed: a systematic bug in a plugin, not a bad input; the process stops."""


@dataclass(frozen=True)
class ServiceFailed:
    """What `call_isolated` returns in place of the result of a request the service failed on."""

    at: str  # "call_batch" (it raised) or "results" (a wrong number of them)
    error: BaseException


def call_isolated(service: str, call_batch: Callable[[list], Sequence], requests: list) -> list:
    """`call_batch(requests)`, one result per request; if it raises, each request is tried alone, so that
    only the requests that raise get a `ServiceFailed`. A wrong number of results fails the whole batch (which
    result belongs to which request is unknown)."""
    try:
        results = list(call_batch(requests))
    except Fatal:
        raise
    except Exception as exc:
        if len(requests) == 1:
            return [ServiceFailed("call_batch", exc)]
        results = None
    if results is None:  # retried outside the handler: a request's own error is logged alone, not "during" the batch's
        return [result for request in requests for result in call_isolated(service, call_batch, [request])]
    if len(results) != len(requests):
        error = RuntimeError(f"service {service!r} returned {len(results)} results for {len(requests)} requests")
        return [ServiceFailed("results", error)] * len(requests)
    return results


class FailureBook:
    """Counts dropped episodes (`failed`, over its life; those past a bound also per reason, `over_bound`) and the
    failures since the last success."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_consecutive_failures must be >= 1, got {limit}")
        self.limit = limit
        self.failed = 0
        self.over_bound: Counter[str] = Counter()
        self.in_a_row = 0
        self._seen: set[tuple[str, str, str, str]] = set()

    def succeeded(self) -> None:
        self.in_a_row = 0

    def dropped(self, failure: EpisodeFailure) -> None:
        """Log and count `failure`; raise `EpisodeFailures` once `limit` episodes in a row have failed, and a
        `Fatal` error at once (it is no episode's failure)."""
        if isinstance(failure.error, Fatal):
            raise failure.error
        self.failed += 1
        self.in_a_row += 1
        error = failure.error
        if isinstance(error, OverBound):
            self.over_bound[error.reason] += 1
        key = (failure.kind, failure.name, type(error).__name__, str(error))
        first = key not in self._seen
        self._seen.add(key)
        stack = _stack(error)
        if stack is not None:  # past a bound: where the plugin's code held the episode, for the first of each
            log.warning("episode dropped: %s%s", failure.describe(), f"\n{stack}" if first else "")
        else:
            log.warning("episode dropped: %s", failure.describe(), exc_info=error if first else None)
            if not first:
                log.debug("traceback of the dropped episode %s", failure.request.episode_id, exc_info=error)
        if self.in_a_row >= self.limit:
            raise EpisodeFailures(
                f"{self.in_a_row} episodes in a row failed and none ended well "
                f"(rollout.max_consecutive_episode_failures={self.limit}); the last: {failure.describe()}"
            ) from error


def _stack(error: BaseException) -> Optional[str]:
    """The stack an OverBound carries, as a traceback's lines (None: log the error's own traceback)."""
    if not isinstance(error, OverBound):
        return None
    lines = "".join(error.stack.format()).rstrip() if error.stack else "  (no plugin code on the stack)"
    return f"where it was (innermost last):\n{lines}"
