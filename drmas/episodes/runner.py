"""Drive many multi-agent episodes at once, handing each agent turn to its engine as soon as it is asked for.

Each orchestra episode is a generator waiting on one agent turn (or tool call). The runner submits every
pending turn to the engine of the agent's model at once (`drmas.engines.base.RequestEngine`) and steps the
engines; whatever turn an engine returns goes straight back to its episode, whose next turn is submitted
before the next step. An engine with continuous batching (vLLM) therefore never waits for the slowest
episode of a "round"; an engine that generates batches (the embedded one) generates, per step, everything
submitted since its last step, which is the round-by-round batching it was built for. `barrier=True`
restores rounds for every engine (each step waits for all submitted turns), for comparison. Tool calls
(`ToolCall`, e.g. retrievals) are batched: one call per tool for all the episodes waiting on it. A turn of
a scripted agent (`AgentSpec.script`: its role computes its turns) is answered at once, in the episode's
own step, and makes no sample.

Episodes whose turns come from outside (the external system: an agent program calling the rollout's HTTP
gateway) wait on a tool that answers `PENDING` until the program's next call arrives. When no engine has work
the runner sleeps in that tool's `wait_for_answers` instead of spinning, and a batching engine is stepped only
once the calls of the episodes it just answered are back (that method gathers them), so HTTP calls share
engine steps the way in-process turns do. A turn may carry its own sampling (`AgentTurn.sampling`, e.g. an HTTP
request's max_tokens and stop strings) and ask for a detailed `Reply`; a turn the engine refuses (too long, a
chat template error) is thrown into its episode.

The result is one `Sample` per agent call of a model, rewards filled in (`drmas.episodes.samples`). `run`
drives a fixed set of episodes to their end (training steps, evaluation). `stream` keeps a rollout process busy instead: before every step it asks
for new episodes, so finished ones are replaced at once, and hands each episode over the moment it ends.

Weights may only change on an engine with nothing in progress. The `on_round` hook runs between engine steps;
the engine side, with the hold, interrupt and release that loading weights there needs, is
`drmas.episodes.submission`.

A failing plugin costs only its episode: an exception from the orchestra's generator (or a turn it yields
for an unknown agent or tool, or an outcome that cannot be trained on), from a scripted agent, or from a
tool's `call_batch` ends the episode as dropped (`EpisodeOutcome.dropped`, the result's `failure` says which
plugin raised what), logged once and counted (`failed`); the other episodes go on. A tool's batch that raises
is retried one request at a time, so only the episodes whose own request raises are dropped.
`max_consecutive_failures` in a row raise `EpisodeFailures` (`drmas.episodes.failures`). Exceptions from the
caller's callbacks and from the engines are not plugin failures: they end the stream as before.

Every episode is bounded (`drmas.episodes.bounds`: turns, tool calls, wall time) and ends the same way past a
bound. Plugin code runs in a thread of the runner's (`drmas.episodes.plugin_thread`; `drmas.episodes.stepping`
steps an episode there), so a call that blocks is abandoned at its deadline, its episodes dropped, and the
others go on; an orchestra with `driver_thread = True` (code bound to the driver's thread) runs inline.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from typing import Callable, Mapping, Optional, Sequence

from drmas.engines.base import Engine
from drmas.mas.base import PENDING, EpisodeOutcome, Orchestra, ToolCall
from drmas.episodes.bounds import DEFAULT_BOUNDS, REASONS, SLOW_CALL_S, EpisodeBounds
from drmas.episodes.failures import EpisodeFailure, EpisodeFailures, FailureBook, ToolFailed, call_isolated
from drmas.episodes.plugin_thread import PluginThread, Stuck
from drmas.episodes.samples import episode_samples
from drmas.episodes.stepping import Ended, LiveEpisode, Stepper, at, generator_stack
from drmas.episodes.submission import EngineRequests, returned
from drmas.episodes.types import AgentSpec, EpisodeRequest, EpisodeResult

log = logging.getLogger(__name__)


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
        self.orchestra = orchestra
        self.tools = dict(getattr(orchestra, "tools", None) or {})
        self.engines = engines
        self.agents = agents
        self.invalid_penalty = invalid_penalty
        self.seed = seed
        self.on_round = on_round
        self.barrier = barrier
        self.failures = FailureBook(max_consecutive_failures)
        if getattr(orchestra, "driver_thread", False):  # its code is bound to the driver's thread: run it there
            bounds = dataclasses.replace(bounds, call_timeout_s=0.0)
        self.bounds = bounds
        self._plugins = PluginThread(slow_after_s=SLOW_CALL_S)
        self._stepper = Stepper(orchestra, self._orchestra_name, agents, self.tools)
        self._next_deadline = float("inf")  # the earliest deadline of a live episode (or later)
        self._waiting: list[LiveEpisode] = []  # episodes whose turn is not submitted yet (or that wait on a tool)

    def run(self, requests: Sequence[EpisodeRequest]) -> list[EpisodeResult]:
        """Run every episode to its end; results come back in request order."""
        results: dict[str, EpisodeResult] = {}
        queued: list[EpisodeRequest] | None = list(requests)

        def admit(_live: int) -> list[EpisodeRequest] | None:
            nonlocal queued
            batch, queued = queued, None
            return batch

        self.stream(admit, lambda result: results.__setitem__(result.request.episode_id, result))
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
        ended = 0

        def finished(result: EpisodeResult) -> None:
            nonlocal ended
            ended += 1
            on_result(result)

        more = True
        try:
            while more or self._waiting or self._engines:
                if more:
                    new = admit(self.live)
                    more = new is not None
                    for req in new or ():
                        self._start(req, finished)
                if not self.live:
                    continue
                self._expire(finished)
                if not self._engines:  # engines idle: let outside answers gather before the next step
                    self._wait_outside(finished)
                before = ended
                self._waiting = self._call_tools(self._waiting, finished)
                if more and ended > before and not self._engines:
                    continue  # episodes ended on a tool's answer: start their successors in this step, not the next
                self._submit_waiting(finished)
                if self.on_round is not None:
                    self.on_round()
                for item, model, generation in self._engines.step(self.barrier):
                    self._advance(item, returned(item, model, generation), self._waiting, finished)
        finally:
            self._engines.abort_all()

    def _start(self, req: EpisodeRequest, on_result: Callable[[EpisodeResult], None]) -> None:
        item = LiveEpisode(req, self.bounds.start(time.monotonic()))
        self._next_deadline = min(self._next_deadline, item.budget.deadline)
        self._advance(item, None, self._waiting, on_result)

    @property
    def _orchestra_name(self) -> str:
        return str(getattr(self.orchestra, "name", "") or type(self.orchestra).__name__)

    def _drop(self, failure: EpisodeFailure, on_result: Callable[[EpisodeResult], None]) -> None:
        """Log and count a dropped episode (too many in a row raise `EpisodeFailures`), then hand it over."""
        self.failures.dropped(failure)
        on_result(EpisodeResult.failed(failure))

    def _finished(self, item: LiveEpisode, outcome: object, on_result: Callable[[EpisodeResult], None]) -> None:
        try:
            if not isinstance(outcome, EpisodeOutcome):
                raise TypeError(f"the episode returned {type(outcome).__name__}, not an EpisodeOutcome")
            samples = episode_samples(item.request.episode_id, item.request.group_id, item.calls, outcome,
                                      self.agents, self.invalid_penalty)
        except Exception as exc:
            self._drop(EpisodeFailure(item.request, "orchestra", self._orchestra_name, "outcome", exc), on_result)
            return
        if not outcome.dropped:
            self.failures.succeeded()
        on_result(EpisodeResult(item.request, outcome, samples))

    @property
    def failed(self) -> int:
        """Episodes dropped because a plugin failed (or ran past a bound), over the runner's life."""
        return self.failures.failed

    def failure_scalars(self) -> dict[str, float]:
        """The metrics of dropped episodes, over the runner's life (see docs/pipeline.md)."""
        return {"rollout/episodes_failed": float(self.failures.failed),
                **{f"rollout/episodes_over_bound/{r}": float(self.failures.over_bound[r]) for r in REASONS},
                "rollout/stuck_plugin_calls": float(self._plugins.stuck)}

    @property
    def live(self) -> int:
        """Episodes started and not ended."""
        return len(self._waiting) + len(self._engines)

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

    # ---- the loop ------------------------------------------------------------------------------------

    def _submit_waiting(self, on_result: Callable[[EpisodeResult], None]) -> None:
        """Submit every waiting agent turn whose engine is not held; a turn the engine refuses (or whose
        messages cannot be encoded) is thrown into its episode."""
        still_waiting: list[LiveEpisode] = []
        for item in self._waiting:
            if not self._engines.can_submit(item):
                still_waiting.append(item)
                continue
            refused = self._engines.submit(item)
            if refused is not None:
                self._advance(item, None, still_waiting, on_result, error=refused)
        self._waiting = still_waiting

    def _call_tools(self, live: list[LiveEpisode], on_result: Callable[[EpisodeResult], None]) -> list[LiveEpisode]:
        """Answer every pending tool call, one batched call per tool, until each live episode waits on an
        agent turn (an episode may call tools several times in a row) or on an answer not there yet (PENDING:
        asked again next round); returns the episodes still live."""
        pending: list[LiveEpisode] = []
        while True:
            by_tool: dict[str, list[LiveEpisode]] = defaultdict(list)
            ready: list[LiveEpisode] = []
            for item in live:
                if isinstance(item.turn, ToolCall):
                    by_tool[item.turn.tool].append(item)
                else:
                    ready.append(item)
            if not by_tool:
                return live + pending
            for tool, items in by_tool.items():
                for item, result in self._tool_results(tool, items, on_result):
                    if result is PENDING:
                        pending.append(item)
                    else:
                        self._advance(item, result, ready, on_result)
            live = ready

    def _tool_results(self, tool: str, items: list[LiveEpisode], on_result: Callable[[EpisodeResult], None]
                      ) -> list[tuple[LiveEpisode, object]]:
        """One batched call of `tool` for `items`; the episodes whose request it fails on are dropped (all of them
        when it does not return in time)."""
        results = self._in_plugin_thread(items, ("tool", tool, "call_batch"), on_result, call_isolated, tool,
                                         self.tools[tool].call_batch, [item.turn.request for item in items])
        if results is _STUCK:
            return []
        answered = []
        for item, result in zip(items, results):
            if isinstance(result, ToolFailed):
                self._close(item)
                self._drop(EpisodeFailure(item.request, "tool", tool, result.at, result.error), on_result)
            else:
                answered.append((item, result))
        return answered

    def _wait_outside(self, on_result: Callable[[EpisodeResult], None]) -> None:
        """Sleep in the `wait_for_answers` of each tool whose answers come from outside (see the module
        docstring); returns at once when no episode waits on one."""
        by_tool: dict[str, list[LiveEpisode]] = defaultdict(list)
        for item in self._waiting:
            if isinstance(item.turn, ToolCall):
                by_tool[item.turn.tool].append(item)
        for tool, items in by_tool.items():
            wait = getattr(self.tools[tool], "wait_for_answers", None)
            if wait is not None and self._in_plugin_thread(items, ("tool", tool, "wait_for_answers"), on_result, wait,
                                                           [item.turn.request for item in items]) is _STUCK:
                gone = set(map(id, items))
                self._waiting = [item for item in self._waiting if id(item) not in gone]

    def _advance(
        self, item: LiveEpisode, response: object, live: list[LiveEpisode], on_result: Callable[[EpisodeResult], None],
        error: Optional[Exception] = None,
    ) -> None:
        """Send the response or tool result (None to start; or throw `error`, a turn the engine refused) and
        either queue what the episode asks an engine or a tool for next or end it (`Stepper.advance`, in the
        plugin thread: scripted agents' turns are answered there, as they come)."""
        if time.monotonic() >= item.budget.deadline:
            self._end_late(item, on_result)
            return
        step = self._in_plugin_thread([item], ("orchestra", self._orchestra_name, item.turn), on_result,
                                      self._stepper.advance, item, response, error)
        if step is None:
            live.append(item)
        elif isinstance(step, Ended):
            self._finished(item, step.value, on_result)
        elif step is not _STUCK:
            self._close(item)
            self._drop(EpisodeFailure(item.request, step.kind, step.name, step.at, step.error), on_result)

    # ---- bounds (drmas.episodes.bounds) --------------------------------------------------------------------

    def _in_plugin_thread(self, items: list[LiveEpisode], plugin: tuple[str, str, object],
                          on_result: Callable[[EpisodeResult], None], fn: Callable, *args: object) -> object:
        """`fn(*args)` in the plugin thread, on behalf of `items`, in `plugin`'s code (kind, name, where; a step
        says where it goes on). If it is not back by its deadline, they are dropped and the result is `_STUCK`."""
        for item in items:
            item.plugin = plugin
        try:
            return self._plugins.call(fn, *args, deadline=self.bounds.call_deadline(
                time.monotonic(), [item.budget for item in items]))
        except Stuck as stuck:
            now = time.monotonic()
            for item in items:  # a stuck tool leaves generators that can be closed; a stuck step does not
                kind, name, where = item.plugin
                if fn != self._stepper.advance:
                    self._close(item)
                self._drop(EpisodeFailure(item.request, kind, name, at(where),
                                          self.bounds.stuck(now, item.budget, stuck.stack)), on_result)
            self._check_stuck(f"{kind} {name!r}")
            return _STUCK

    def _check_stuck(self, last: str) -> None:
        problem = self.bounds.too_many_stuck(self._plugins.stuck)
        if problem:
            raise EpisodeFailures(f"{problem}; the last: {last}")

    def _expire(self, on_result: Callable[[EpisodeResult], None]) -> None:
        """Drop the live episodes past their deadline: waiting ones, and running ones (their requests aborted)."""
        now = time.monotonic()
        if now < self._next_deadline:
            return
        for item in [item for item in (*self._waiting, *self._engines.running) if now >= item.budget.deadline]:
            if item.submitted:
                self._engines.abort(item)
            else:
                self._waiting.remove(item)
            self._end_late(item, on_result)
        live = (*self._waiting, *self._engines.running)
        self._next_deadline = min((item.budget.deadline for item in live), default=float("inf"))

    def _end_late(self, item: LiveEpisode, on_result: Callable[[EpisodeResult], None]) -> None:
        over = self.bounds.expired(generator_stack(item.episode))
        self._close(item)
        self._drop(EpisodeFailure(item.request, "orchestra", self._orchestra_name, at(item.turn), over), on_result)

    def _close(self, item: LiveEpisode) -> None:
        """Close a dropped episode's generator (its `finally` blocks run) in the plugin thread; an error there
        changes nothing, and a close that blocks is abandoned like any stuck call."""
        if item.episode is None:
            return
        try:
            self._plugins.call(item.episode.close, deadline=self.bounds.call_deadline(time.monotonic(), ()))  # type: ignore[attr-defined]
        except Stuck as stuck:
            log.warning("episode %s: its generator did not close within rollout.plugin_call_timeout_s=%g s and was "
                        "abandoned at:\n%s", item.request.episode_id, self.bounds.call_timeout_s,
                        "".join(stuck.stack.format()).rstrip())
            self._check_stuck(f"closing episode {item.request.episode_id}")
        except Exception:
            pass


_STUCK = object()  # what a plugin call that was abandoned returns (`EpisodeRunner._in_plugin_thread`)
