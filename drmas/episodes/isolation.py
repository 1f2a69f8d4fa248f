"""Every call into plugin code on behalf of episodes, and what an episode becomes when one fails or blocks.

Plugins (the orchestra's generator, scripted agents, services) are user code; the episode loop calls them only
through `PluginCalls`, which runs each call in the plugin thread (`drmas.episodes.plugin_thread`) under the
episodes' bounds (`drmas.episodes.bounds`), and turns what goes wrong into dropped episodes
(`drmas.episodes.failures`): an exception, a turn for an unknown agent or service, an outcome that cannot be
trained on, a bound passed, a call abandoned at its deadline. Only the episodes a call was made for are
dropped; the others go on. Stepping one episode (its orchestra, its scripted agents) is
`drmas.episodes.stepping`'s; this module acts on what a step returns, in the driver's thread.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Mapping, Optional

from drmas.mas.base import EpisodeOutcome, Orchestra
from drmas.episodes.bounds import REASONS, SLOW_CALL_S, EpisodeBounds
from drmas.episodes.failures import EpisodeFailure, EpisodeFailures, FailureBook
from drmas.episodes.plugin_thread import PluginThread, Stuck
from drmas.episodes.samples import episode_samples
from drmas.episodes.stepping import Ended, LiveEpisode, Stepper, at, generator_stack
from drmas.episodes.types import AgentSpec, EpisodeResult

log = logging.getLogger(__name__)

STUCK = object()  # what a plugin call that was abandoned returns (`PluginCalls.call`)


class PluginCalls:
    """Plugin calls for the episodes of one runner; an ended or dropped episode goes to `on_result` (the
    stream's), counted in `handed_over`."""

    def __init__(self, orchestra: Orchestra, name: str, agents: Mapping[str, AgentSpec], services: Mapping[str, object],
                 invalid_penalty: float, bounds: EpisodeBounds, failures: FailureBook) -> None:
        self.name, self.agents, self.invalid_penalty = name, agents, invalid_penalty
        self.bounds, self.failures = bounds, failures
        self.thread = PluginThread(slow_after_s=SLOW_CALL_S)
        self.stepper = Stepper(orchestra, name, agents, services)
        self.on_result: Callable[[EpisodeResult], None] = lambda result: None  # the stream's, while one runs
        self.handed_over = 0

    def advance(self, item: LiveEpisode, response: object, live: list[LiveEpisode],
                error: Optional[Exception] = None) -> None:
        """Send the response or service result (None to start; or throw `error`, a turn the engine refused) and
        either queue the episode on `live`, waiting on what it asks an engine or a service for next, or end it
        (`Stepper.advance`, in the plugin thread: scripted agents' turns are answered there, as they come)."""
        if time.monotonic() >= item.budget.deadline:
            self.end_late(item)
            return
        step = self.call([item], ("orchestra", self.name, item.turn), self.stepper.advance, item, response, error,
                         close=False)
        if step is None:
            live.append(item)
        elif isinstance(step, Ended):
            self._ended(item, step.value)
        elif step is not STUCK:
            self.drop(item, EpisodeFailure(item.request, step.kind, step.name, step.at, step.error))

    def call(self, items: list[LiveEpisode], plugin: tuple[str, str, object], fn: Callable, *args: object,
             close: bool = True) -> object:
        """`fn(*args)` in the plugin thread, on behalf of `items`, in `plugin`'s code (kind, name, where; a step
        says where it goes on). If it is not back by its deadline, they are dropped (their generators closed
        with `close`: a stuck step leaves none that can be) and the result is `STUCK`."""
        for item in items:
            item.plugin = plugin
        try:
            return self.thread.call(fn, *args, deadline=self.bounds.call_deadline(
                time.monotonic(), [item.budget for item in items]))
        except Stuck as stuck:
            now = time.monotonic()
            for item in items:
                kind, name, where = item.plugin
                over = self.bounds.stuck(now, item.budget, stuck.stack)
                self.drop(item, EpisodeFailure(item.request, kind, name, at(where), over), close=close)
            self._check_stuck(f"{kind} {name!r}")
            return STUCK

    def drop(self, item: LiveEpisode, failure: EpisodeFailure, close: bool = True) -> None:
        """Close the episode's generator (with `close`), log and count the failure (too many in a row raise
        `EpisodeFailures`), then hand the dropped episode over."""
        if close:
            self._close(item)
        self.failures.dropped(failure)
        self._hand_over(EpisodeResult.failed(failure))

    def end_late(self, item: LiveEpisode) -> None:
        """Drop an episode past its deadline, with where its generator waits."""
        over = self.bounds.expired(generator_stack(item.episode))
        self.drop(item, EpisodeFailure(item.request, "orchestra", self.name, at(item.turn), over))

    def scalars(self) -> dict[str, float]:
        """The metrics of dropped episodes and stuck calls, over the runner's life (see docs/pipeline.md)."""
        return {"rollout/episodes_failed": float(self.failures.failed),
                **{f"rollout/episodes_over_bound/{r}": float(self.failures.over_bound[r]) for r in REASONS},
                "rollout/stuck_plugin_calls": float(self.thread.stuck)}

    def _ended(self, item: LiveEpisode, outcome: object) -> None:
        try:
            if not isinstance(outcome, EpisodeOutcome):
                raise TypeError(f"the episode returned {type(outcome).__name__}, not an EpisodeOutcome")
            samples = episode_samples(item.request.episode_id, item.request.group_id, item.calls, outcome,
                                      self.agents, self.invalid_penalty)
        except Exception as exc:
            self.drop(item, EpisodeFailure(item.request, "orchestra", self.name, "outcome", exc), close=False)
            return
        if not outcome.dropped:
            self.failures.succeeded()
        self._hand_over(EpisodeResult(item.request, outcome, samples))

    def _hand_over(self, result: EpisodeResult) -> None:
        self.handed_over += 1
        self.on_result(result)

    def _close(self, item: LiveEpisode) -> None:
        """Close a dropped episode's generator (its `finally` blocks run) in the plugin thread; an error there
        changes nothing, and a close that blocks is abandoned like any stuck call."""
        if item.episode is None:
            return
        try:
            self.thread.call(item.episode.close, deadline=self.bounds.call_deadline(time.monotonic(), ()))  # type: ignore[attr-defined]
        except Stuck as stuck:
            log.warning("episode %s: its generator did not close within rollout.plugin_call_timeout_s=%g s and was "
                        "abandoned at:\n%s", item.request.episode_id, self.bounds.call_timeout_s,
                        "".join(stuck.stack.format()).rstrip())
            self._check_stuck(f"closing episode {item.request.episode_id}")
        except Exception:
            pass

    def _check_stuck(self, last: str) -> None:
        problem = self.bounds.too_many_stuck(self.thread.stuck)
        if problem:
            raise EpisodeFailures(f"{problem}; the last: {last}")
