"""Drive many multi-agent episodes at once, handing each agent turn to its engine as soon as it is asked for.

Each orchestra episode is a generator waiting on one agent turn (or service call). The runner submits every
pending turn to the engine of the agent's model at once (`drmas.engines.base.RequestEngine`) and steps the
engines; whatever turn an engine returns goes straight back to its episode, whose next turn is submitted
before the next step. An engine with continuous batching (vLLM) therefore never waits for the slowest
episode of a "round"; an engine that generates batches (the embedded one) generates, per step, everything
submitted since its last step, which is the round-by-round batching it was built for. `barrier=True`
restores rounds for every engine (each step waits for all submitted turns), for comparison.

The result is one `Sample` per agent call of a model, rewards filled in (`drmas.episodes.samples`). `run`
drives a fixed set of episodes to their end (training steps, evaluation). `stream` keeps a rollout process busy
instead: before every step it asks for new episodes, so finished ones are replaced at once, and hands each
episode over the moment it ends. The `on_round` hook runs between engine steps: the place to load weights.

This module is the loop and nothing else; each of its seams is a part of its own:

* `drmas.episodes.submission`: turns on engines (a turn's prompt and sampling, a turn the engine refuses
  thrown into its episode), and the hold, interrupt and release that weight loading needs;
* `drmas.episodes.services`: service calls batched across episodes, and answers that come from outside (the
  gateway's HTTP calls);
* `drmas.episodes.isolation` (with `stepping`, `plugin_thread`, `bounds`, `failures`): every plugin call, each
  bounded; a plugin that fails or blocks, or an episode past a bound, costs only its episodes (dropped, logged,
  counted: `failed`). Exceptions from the caller's callbacks and from the engines are not plugin failures:
  they end the stream.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Mapping, Optional, Sequence

from drmas.engines.base import Engine
from drmas.mas.base import Orchestra
from drmas.episodes.bounds import DEFAULT_BOUNDS, EpisodeBounds
from drmas.episodes.failures import FailureBook
from drmas.episodes.isolation import PluginCalls
from drmas.episodes.services import ServiceCalls, orchestra_services
from drmas.episodes.stepping import LiveEpisode
from drmas.episodes.submission import EngineRequests, returned
from drmas.episodes.types import AgentSpec, EpisodeRequest, EpisodeResult


class EpisodeRunner:
    """Runs episodes of one orchestra against a set of engines (one per model id)."""

    def __init__(
        self,
        orchestra: Orchestra,
        engines: Mapping[str, Engine],
        agents: Mapping[str, AgentSpec],
        invalid_penalty: float,
        seed: int | None = None,
        on_round: Optional[Callable[[], None]] = None,
        barrier: bool = False,
        max_consecutive_failures: int = 32,
        bounds: EpisodeBounds = DEFAULT_BOUNDS,
    ) -> None:
        """With `seed`, every call is sampled from its own stream derived from (seed, episode id, turn):
        the same episode samples the same tokens whatever else shares its batch, and a resumed run
        continues exactly as an uninterrupted one would.

        `on_round`, if given, is called before every engine step (never during one): the place to load new
        weights, under the rule in `drmas.episodes.submission`. `barrier` makes every step wait for all submitted
        turns before any episode goes on (rounds). `max_consecutive_failures`: episodes failing in a row, none
        ending well, after which the runner raises `EpisodeFailures` (`rollout.max_consecutive_episode_failures`).
        `bounds`: how long an episode may run (`drmas.episodes.bounds`, `rollout.max_episode_turns` and the rest)."""
        missing = [a for a in orchestra.agents if a not in agents]
        if missing:
            raise ValueError(f"the orchestra needs agents {missing} that are not configured")
        self._engines = EngineRequests(engines, agents, seed)
        self.orchestra, self.engines, self.agents = orchestra, engines, agents
        self.services = orchestra_services(orchestra)
        self.invalid_penalty, self.seed, self.on_round, self.barrier = invalid_penalty, seed, on_round, barrier
        self.failures = FailureBook(max_consecutive_failures)
        if getattr(orchestra, "driver_thread", False):  # its code is bound to the driver's thread: run it there
            bounds = dataclasses.replace(bounds, call_timeout_s=0.0)
        self.bounds = bounds
        name = str(getattr(orchestra, "name", "") or type(orchestra).__name__)
        self._plugins = PluginCalls(orchestra, name, agents, self.services, invalid_penalty, bounds, self.failures)
        self._services = ServiceCalls(self.services, self._plugins)
        self._waiting: list[LiveEpisode] = []  # episodes whose turn is not submitted yet (or that wait on a service)
        self._next_deadline = float("inf")  # the earliest deadline of a live episode (or later)

    def run(self, requests: Sequence[EpisodeRequest]) -> list[EpisodeResult]:
        """Run every episode to its end; results come back in request order."""
        results: dict[str, EpisodeResult] = {}
        batches = [list(requests)]  # all admitted at once, then no more
        self.stream(lambda _live: batches.pop() if batches else None,
                    lambda result: results.__setitem__(result.request.episode_id, result))
        return [results[req.episode_id] for req in requests]

    def stream(
        self,
        admit: Callable[[int], Optional[Sequence[EpisodeRequest]]],
        on_result: Callable[[EpisodeResult], None],
    ) -> None:
        """Run episodes as they are admitted until `admit` says there will be no more and all have ended.

        Before every engine step `admit(number of live episodes)` returns the episodes to start now
        (possibly none), or None once no more will come. When nothing is live, `admit` is called again at
        once, so it should wait a little itself rather than return an empty list immediately. Every finished
        episode goes to `on_result` as soon as it ends (a dropped one too: `outcome.dropped`). An exception from
        either callback (or `on_round`), or `EpisodeFailures`, ends the stream; episodes still live are then
        abandoned (and their running requests aborted).
        """
        self._waiting = []
        self._engines.reset()
        self._plugins.on_result = on_result
        more = True
        try:
            while more or self._waiting or self._engines:
                more = self._round(admit, more)
        finally:
            self._plugins.on_result = lambda result: None  # keeps no caller's callback alive
            self._engines.abort_all()

    def _round(self, admit: Callable[[int], Optional[Sequence[EpisodeRequest]]], more: bool) -> bool:
        """Admit (while `more` may come), then take every live episode as far as it goes: past its deadline,
        through its service calls, onto its engine, and one engine step. Returns whether more may still come."""
        if more:
            new = admit(self.live)
            more = new is not None
            for req in new or ():
                self._start(req)
        if not self.live:
            return more
        self._expire()
        if not self._engines:  # engines idle: let outside answers gather before the next step
            self._waiting = self._services.wait_outside(self._waiting)
        before = self._plugins.handed_over
        self._waiting = self._services.answer(self._waiting)
        if more and self._plugins.handed_over > before and not self._engines:
            return more  # episodes ended on a service's answer: start their successors in this step, not the next
        self._submit_waiting()
        if self.on_round is not None:
            self.on_round()
        for item, model, generation in self._engines.step(self.barrier):
            self._plugins.advance(item, returned(item, model, generation), self._waiting)
        return more

    @property
    def live(self) -> int:
        """Episodes started and not ended."""
        return len(self._waiting) + len(self._engines)

    @property
    def failed(self) -> int:
        """Episodes dropped because a plugin failed (or ran past a bound), over the runner's life."""
        return self.failures.failed

    def failure_scalars(self) -> dict[str, float]:
        """The metrics of dropped episodes, over the runner's life (see docs/pipeline.md)."""
        return self._plugins.scalars()

    # ---- weights may change only on an idle engine (`drmas.episodes.submission`) -------------------------

    def in_progress(self, model: str) -> int:
        """Requests of `model` whose generation has started and not ended."""
        return self._engines.in_progress(model)

    def hold(self, model: str) -> None:
        """Submit nothing new to `model`'s engine until `release`: the running requests finish, then it idles."""
        self._engines.hold(model)

    def release(self, model: str) -> None:
        self._engines.release(model)

    def interrupt(self, model: str) -> None:
        """Abort what runs on `model`'s engine; those turns go back to be submitted again (same seeds)."""
        self._waiting.extend(self._engines.interrupt(model))

    # ---- the loop's steps ------------------------------------------------------------------------------

    def _start(self, req: EpisodeRequest) -> None:
        item = LiveEpisode(req, self.bounds.start(time.monotonic()))
        self._next_deadline = min(self._next_deadline, item.budget.deadline)
        self._plugins.advance(item, None, self._waiting)

    def _submit_waiting(self) -> None:
        """Submit every waiting agent turn whose engine is not held; a turn the engine refuses (or whose
        messages cannot be encoded) is thrown into its episode."""
        still_waiting: list[LiveEpisode] = []
        for item in self._waiting:
            if not self._engines.can_submit(item):
                still_waiting.append(item)
                continue
            refused = self._engines.submit(item)
            if refused is not None:
                self._plugins.advance(item, None, still_waiting, error=refused)
        self._waiting = still_waiting

    def _expire(self) -> None:
        """Drop the live episodes past their deadline: waiting ones, and running ones (their requests aborted)."""
        now = time.monotonic()
        if now < self._next_deadline:
            return
        for item in [item for item in (*self._waiting, *self._engines.running) if now >= item.budget.deadline]:
            if item.submitted:
                self._engines.abort(item)
            else:
                self._waiting.remove(item)
            self._plugins.end_late(item)
        live = (*self._waiting, *self._engines.running)
        self._next_deadline = min((item.budget.deadline for item in live), default=float("inf"))

