"""Where the gateway's HTTP handlers meet the rollout's driver: episodes, their queued calls, and the answers.

Two threads share it, under one lock. The gateway's event loop hands episodes out (`claim`), queues an episode's
calls and its end (`submit`) and awaits their futures; it never blocks here. The driver thread (the one that owns
the engines) opens episodes (`open`), takes each one's next event (`next_events`: a `Call`, an `End`, or
`Dropped`), answers it (`answer` / `refuse`), and, when no engine has work, sleeps in `wait`.

`wait` is also what keeps an engine's batches full. It is called only when no engine has work (a call that
arrives while one generates joins its running batch at the next step). The calls of a program's episodes come
back one by one, a few milliseconds apart, after the replies they answer; so `wait` returns only once the
episodes answered (or opened: new ones replace those that ended) within the last `batch_wait_s` have called (or
ended), or that window has passed: those calls start in one batch, as the turns of in-process episodes do,
instead of trickling in (or forming two cohorts that take turns at the engine for good).

An episode is dropped (its next event is `Dropped`) when it has not ended `episode_timeout_s` after it was handed
out (or, never handed out, after it was opened: a driver running a fixed set of episodes must not wait forever on
a program that stopped asking), or when the program that claimed it exits (`drop_claimed`); its queued calls are
refused, and later requests naming it get 410 with the reason.

Every request the gateway queued is answered, by the driver or here: an event the driver took and will not answer
(its episode abandoned: the generator closed; or the rollout stopping: `close`) is answered with an error, since
its HTTP handler awaits that answer and the server cannot stop while a handler runs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Callable, Optional, Sequence, Union

from drmas.gateway.openai_api import ApiError, ChatCall, RewardRequest
from drmas.mas.base import PENDING
from drmas.tasks.base import Problem

SLICE_S = 0.05  # longest sleep in `wait`: the driver polls weights, admission and its stop flag in between
_GONE_MEMORY = 4096  # ended or dropped episodes remembered, to tell a late request why its episode is gone


@dataclass
class Call:
    """A chat completion request of an episode; its future gets the `Reply` of every choice."""

    id: str  # the completion id the program sees (per-call rewards name it)
    request: ChatCall
    future: Future = field(default_factory=Future)


@dataclass
class End:
    """The episode's reward report; its future gets the summary the program sees."""

    request: RewardRequest
    future: Future = field(default_factory=Future)


@dataclass(frozen=True)
class Dropped:
    """The episode will not end: why (it timed out, or its program exited)."""

    reason: str


@dataclass(frozen=True)
class Claim:
    """An episode handed out: what the program is told."""

    episode_id: str
    problem: Problem

    def payload(self) -> dict:
        return {"id": self.episode_id, "object": "episode",
                "problem": {"uid": self.problem.uid, "question": self.problem.question}}


Event = Union[Call, End, Dropped]


@dataclass
class _Episode:
    id: str
    problem: Problem
    opened_at: float
    claimed_at: Optional[float] = None
    touched_at: float = 0.0  # when it was opened, handed out or last answered: a call (or a claim) is due
    events: deque = field(default_factory=deque)
    taken: Optional[Union[Call, End]] = None  # the event the driver took and has not answered yet
    dropped: str = ""


def resolve(future: Future, value: Any = None, error: Optional[BaseException] = None) -> None:
    """Set a future's result (or exception) unless its waiter gave up on it (cancelled) already."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)
    except InvalidStateError:
        pass


class Inbox:
    """The gateway's episodes (see the module docstring); thread-safe."""

    def __init__(self, episode_timeout_s: float, batch_wait_s: float, clock: Callable[[], float] = time.monotonic):
        self.episode_timeout_s = episode_timeout_s
        self.batch_wait_s = batch_wait_s
        self._clock = clock
        self._cond = threading.Condition()
        self._episodes: dict[str, _Episode] = {}
        self._unclaimed: deque[str] = deque()
        self._claimers: deque[Future] = deque()
        self._gone: OrderedDict[str, str] = OrderedDict()
        self._closed = ""
        self.dropped = 0  # episodes dropped so far

    # ---- the driver thread ----------------------------------------------------------------------------------

    def open(self, problem: Problem) -> str:
        """A new episode of `problem`, handed to the longest-waiting claim (or queued for the next one)."""
        now = self._clock()
        episode = _Episode(f"ep-{uuid.uuid4().hex}", problem, opened_at=now, touched_at=now)
        with self._cond:
            self._episodes[episode.id] = episode
            self._unclaimed.append(episode.id)
            self._hand_out()
        return episode.id

    def next_events(self, episode_ids: Sequence[str]) -> list[Any]:
        """Each episode's next event, or PENDING while it has none; an episode past its deadline gets Dropped."""
        now = self._clock()
        out: list[Any] = []
        with self._cond:
            for episode_id in episode_ids:
                episode = self._episodes.get(episode_id)
                if episode is None:  # forgotten under it: cannot happen while its generator waits on it
                    out.append(Dropped(self._closed or "the gateway forgot it"))
                    continue
                self._expire(episode, now)
                if self._closed or episode.dropped:
                    out.append(Dropped(self._closed or episode.dropped))
                elif episode.events and episode.taken is None:
                    episode.taken = episode.events.popleft()
                    out.append(episode.taken)
                else:
                    out.append(PENDING)
        return out

    def wait(self, episode_ids: Sequence[str]) -> None:
        """Sleep while any of these episodes is expected to call soon (see the module docstring); when none is,
        return at once if one has an event, else after `SLICE_S` at most (the driver has other duties)."""
        deadline = self._clock() + SLICE_S
        with self._cond:
            while not self._closed:
                now = self._clock()
                episodes = [e for e in map(self._episodes.get, episode_ids) if e is not None]
                due = [e.touched_at + self.batch_wait_s for e in episodes
                       if e.taken is None and not (e.events or e.dropped)]
                gathered_at = max((t for t in due if t > now), default=None)
                if gathered_at is None:
                    if now >= deadline or any((e.events and e.taken is None) or e.dropped or self._overdue(e, now)
                                              for e in episodes):
                        return
                    gathered_at = deadline
                self._cond.wait(gathered_at - now)

    def answer(self, episode_id: str, event: Union[Call, End], value: Any) -> None:
        """Answer the event the driver took; the episode's program may now call again."""
        resolve(event.future, value)
        self._done_with(episode_id)

    def refuse(self, episode_id: str, event: Union[Call, End], error: ApiError) -> None:
        resolve(event.future, error=error)
        self._done_with(episode_id)

    def forget(self, episode_id: str, why: str) -> int:
        """The episode ended, was dropped or abandoned: what of it is still unanswered (queued, or taken by a
        driver that gave it up) and requests naming it from now on get 410, "episode <id> <why>". Returns how
        many requests in flight it answered so."""
        with self._cond:
            episode = self._episodes.pop(episode_id, None)
            if episode is None:
                return 0
            if episode_id in self._unclaimed:
                self._unclaimed.remove(episode_id)
            self._remember(episode_id, why)
            unanswered = [event for event in _unanswered(episode) if not event.future.done()]
            for event in unanswered:
                resolve(event.future, error=_gone(episode_id, why))
        return len(unanswered)

    def drop_claimed(self, reason: str) -> int:
        """Drop every episode handed out (their program exited; a new one starts afresh); returns how many."""
        with self._cond:
            claimed = [e for e in self._episodes.values() if e.claimed_at is not None and not e.dropped]
            for episode in claimed:
                self._drop(episode, reason)
            self._cond.notify_all()
        return len(claimed)

    def close(self, reason: str) -> int:
        """Refuse everything waiting, the events the driver took included (it stops: it will not answer them),
        and everything to come (503); from now on every episode's next event is `Dropped`. Returns how many
        calls and reward reports were refused (claims not counted)."""
        with self._cond:
            self._closed = reason
            while self._claimers:
                resolve(self._claimers.popleft(), error=_unavailable(reason))
            refused = 0
            for episode in self._episodes.values():
                for event in _unanswered(episode):
                    refused += not event.future.done()
                    resolve(event.future, error=_unavailable(reason))
                episode.taken = None
                episode.events.clear()
            self._cond.notify_all()
        return refused

    # ---- the gateway's event loop ---------------------------------------------------------------------------

    def claim(self) -> Future:
        """A future that gets the next episode handed out (a `Claim`); cancel it to give up waiting."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise _unavailable(self._closed)
            self._claimers.append(future)
            self._hand_out()
        return future

    def submit(self, episode_id: str, event: Union[Call, End]) -> None:
        """Queue a call or the end of an episode handed out (ApiError: an unknown, gone or unclaimed episode)."""
        with self._cond:
            if episode_id in self._gone:
                raise _gone(episode_id, self._gone[episode_id])
            if self._closed:
                raise _unavailable(self._closed)
            episode = self._episodes.get(episode_id)
            if episode is None:
                raise ApiError(HTTPStatus.NOT_FOUND, f"no episode {episode_id!r}: start one with POST "
                               "/drmas/v1/episodes and name it in the X-Drmas-Episode header or the `user` field",
                               param="user", code="episode_not_found")
            if episode.claimed_at is None:
                raise ApiError(HTTPStatus.CONFLICT, f"episode {episode_id} was not handed out", code="episode_unclaimed")
            if episode.dropped:
                raise _gone(episode_id, f"was dropped: {episode.dropped}")
            episode.events.append(event)
            self._cond.notify_all()

    # ---- inside the lock ------------------------------------------------------------------------------------

    def _hand_out(self) -> None:
        """Match waiting claims with unclaimed episodes, oldest first (a claim given up on is skipped)."""
        while self._unclaimed and self._claimers:
            episode = self._episodes.get(self._unclaimed[0])
            if episode is None or episode.dropped:  # timed out before anyone asked
                self._unclaimed.popleft()
                continue
            future = self._claimers.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            self._unclaimed.popleft()
            episode.claimed_at = episode.touched_at = self._clock()
            future.set_result(Claim(episode.id, episode.problem))

    def _done_with(self, episode_id: str) -> None:
        with self._cond:
            episode = self._episodes.get(episode_id)
            if episode is not None:
                episode.taken = None
                episode.touched_at = self._clock()

    def _overdue(self, episode: _Episode, now: float) -> bool:
        since = episode.claimed_at if episode.claimed_at is not None else episode.opened_at
        return now - since > self.episode_timeout_s

    def _expire(self, episode: _Episode, now: float) -> None:
        if episode.dropped or not self._overdue(episode, now):
            return
        if episode.claimed_at is None:
            self._drop(episode, f"no program asked for it within system.episode_timeout_s={self.episode_timeout_s:g} s")
        else:
            self._drop(episode, f"it did not end within system.episode_timeout_s={self.episode_timeout_s:g} s of "
                                "being handed out (no reward reported)")

    def _drop(self, episode: _Episode, reason: str) -> None:
        episode.dropped = reason
        self.dropped += 1
        while episode.events:
            resolve(episode.events.popleft().future, error=_gone(episode.id, f"was dropped: {reason}"))

    def _remember(self, episode_id: str, why: str) -> None:
        self._gone[episode_id] = why
        while len(self._gone) > _GONE_MEMORY:
            self._gone.popitem(last=False)


def _unanswered(episode: _Episode) -> list[Union[Call, End]]:
    """The episode's events whose requests still await an answer: the one the driver took, then the queued."""
    return [*([episode.taken] if episode.taken is not None else []), *episode.events]


def _gone(episode_id: str, why: str) -> ApiError:
    return ApiError(HTTPStatus.GONE, f"episode {episode_id} {why}", code="episode_gone")


def _unavailable(reason: str) -> ApiError:
    return ApiError(HTTPStatus.SERVICE_UNAVAILABLE, f"the drmas gateway is not serving: {reason}", type="server_error",
                    code="unavailable")
