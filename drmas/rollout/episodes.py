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

The result is one `Sample` per agent call of a model, rewards filled in (`drmas.rollout.samples`). `run`
drives a fixed set of episodes to their end (training steps, evaluation). `stream` keeps a rollout process busy instead: before every step it asks
for new episodes, so finished ones are replaced at once, and hands each episode over the moment it ends.

Weights may only change on an engine with nothing in progress, or a response would mix versions. The
`on_round` hook runs between engine steps; to load weights there, a caller checks `in_progress(model)` and,
while requests run, `hold(model)` (submit nothing new, let the running ones finish) or `interrupt(model)`
(abort them; they are submitted again afterwards, with their own seeds, so nothing else changes), then
`release(model)` once the weights are in. A model here is what an agent names (`AgentSpec.model`): several
models may share one engine (LoRA adapters of one base, `AgentSpec.engine`), and holding, interrupting or
counting one of them touches only its own requests on that engine.

A failing plugin costs only its episode: an exception from the orchestra's generator (or a turn it yields
for an unknown agent or tool, or an outcome that cannot be trained on), from a scripted agent, or from a
tool's `call_batch` ends the episode as dropped (`EpisodeOutcome.dropped`, the result's `failure` says which
plugin raised what), logged once and counted (`failed`); the other episodes go on. A tool's batch that raises
is retried one request at a time, so only the episodes whose own request raises are dropped.
`max_consecutive_failures` in a row raise `EpisodeFailures` (`drmas.rollout.failures`). Exceptions from the
caller's callbacks and from the engines are not plugin failures: they end the stream as before.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from drmas.core.sample import Sample
from drmas.core.tool_calls import prompt_ids
from drmas.engines.base import Engine, Generation, SamplingParams, request_level
from drmas.mas.base import PENDING, AgentTurn, EpisodeOutcome, Orchestra, Reply, ToolCall
from drmas.rollout.failures import EpisodeFailure, FailureBook, ToolFailed, call_isolated
from drmas.rollout.samples import Call, episode_samples
from drmas.rollout.turn_sampling import turn_sampling
from drmas.tasks.base import Problem


@dataclass(frozen=True)
class AgentSpec:
    """How one agent is served: its model id and its sampling parameters; or, for an agent whose role is
    scripted, the code that computes its turns (`script(turn) -> reply text`; no model, no sampling).
    `engine`: the key of the engine that serves the model when it is not the model id itself (an adapter
    `base/solver` is served by engine `base`; its sampling parameters name the adapter)."""

    model: str
    sampling: Optional[SamplingParams]
    script: Optional[Callable[[AgentTurn], str]] = None
    engine: str = ""

    @property
    def engine_key(self) -> str:
        return self.engine or self.model


@dataclass
class EpisodeRequest:
    """One episode to run: which problem, which GRPO group it belongs to, its unique id. `agents` replaces
    the runner's agent specs for this episode only (same models, other sampling): an evaluation's episodes
    run in the same stream as training episodes (`drmas.evaluation.interval`)."""

    episode_id: str
    group_id: str
    problem: Problem
    agents: Optional[Mapping[str, AgentSpec]] = None


@dataclass
class EpisodeResult:
    request: EpisodeRequest
    outcome: EpisodeOutcome
    samples: list[Sample] = field(default_factory=list)
    failure: Optional[EpisodeFailure] = None  # a plugin failed: the episode was dropped (`outcome.dropped`)

    @classmethod
    def failed(cls, failure: EpisodeFailure) -> EpisodeResult:
        """A dropped episode: no samples, reward 0, no turns (an evaluation counts it wrong)."""
        return cls(failure.request, EpisodeOutcome(reward=0.0, turns=[], dropped=failure.describe()), failure=failure)


@dataclass
class _Live:
    request: EpisodeRequest
    episode: object  # the orchestra's generator
    turn: AgentTurn | ToolCall  # what the episode waits for
    calls: list[Call] = field(default_factory=list)
    submitted: str = ""  # the engine request id of `turn` while it runs
    prompt_ids: list[int] = field(default_factory=list)  # of `turn`, once submitted
    params: Optional[SamplingParams] = None  # of `turn`, once submitted

    @property
    def request_id(self) -> str:
        return f"{self.request.episode_id}/{len(self.calls)}"


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
    ) -> None:
        """With `seed`, every call is sampled from its own stream derived from (seed, episode id, turn):
        the same episode samples the same tokens whatever else shares its batch, and a resumed run
        continues exactly as an uninterrupted one would.

        `on_round`, if given, is called before every engine step (never during one): the place to load new
        weights, under the rule in the module docstring. `barrier` makes every step wait for all submitted
        turns before any episode goes on (rounds). `max_consecutive_failures`: episodes failing in a row, none
        ending well, after which the runner raises `EpisodeFailures` (`rollout.max_consecutive_episode_failures`)."""
        missing = [a for a in orchestra.agents if a not in agents]
        if missing:
            raise ValueError(f"the orchestra needs agents {missing} that are not configured")
        for name, spec in agents.items():
            if spec.script is None and spec.engine_key not in engines:
                raise ValueError(f"agent {name!r} uses model {spec.model!r} which has no engine")
        self.orchestra = orchestra
        self.tools = dict(getattr(orchestra, "tools", None) or {})
        self.engines = engines
        self.agents = agents
        self.invalid_penalty = invalid_penalty
        self.seed = seed
        self.on_round = on_round
        self.barrier = barrier
        self.failures = FailureBook(max_consecutive_failures)
        self._requests = {key: request_level(engine) for key, engine in engines.items()}
        self._engine_of = {spec.model: spec.engine_key for spec in agents.values() if spec.script is None}
        # models that share their engine with other models: their own requests are counted apart
        keys = list(self._engine_of.values())
        self._shared = {model for model, key in self._engine_of.items() if keys.count(key) > 1}
        self._held: set[str] = set()
        self._waiting: list[_Live] = []  # episodes whose turn is not submitted yet (or that wait on a tool)
        self._running: dict[str, _Live] = {}  # engine request id -> episode

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
        self._waiting, self._running, self._held = [], {}, set()
        ended = 0

        def finished(result: EpisodeResult) -> None:
            nonlocal ended
            ended += 1
            on_result(result)

        more = True
        try:
            while more or self._waiting or self._running:
                if more:
                    new = admit(self.live)
                    more = new is not None
                    for req in new or ():
                        self._start(req, finished)
                if not self.live:
                    continue
                if not self._running:  # engines idle: let outside answers gather before the next step
                    self._wait_outside()
                before = ended
                self._waiting = self._call_tools(self._waiting, finished)
                if more and ended > before and not self._running:
                    continue  # episodes ended on a tool's answer: start their successors in this step, not the next
                self._submit_waiting(finished)
                if self.on_round is not None:
                    self.on_round()
                self._step_engines(finished)
        finally:
            for key, engine in self._requests.items():
                running = [rid for rid, item in self._running.items() if self._engine_key(item) == key]
                if running:
                    engine.abort(running)
            self._running = {}

    def _start(self, req: EpisodeRequest, on_result: Callable[[EpisodeResult], None]) -> None:
        try:
            episode = self.orchestra.run(req.problem)
        except Exception as exc:
            self._drop(EpisodeFailure(req, "orchestra", self._orchestra_name, "start", exc), on_result)
            return
        self._advance(_Live(req, episode, turn=None), None, self._waiting, on_result)  # type: ignore[arg-type]

    @property
    def _orchestra_name(self) -> str:
        return str(getattr(self.orchestra, "name", "") or type(self.orchestra).__name__)

    def _drop(self, failure: EpisodeFailure, on_result: Callable[[EpisodeResult], None]) -> None:
        """Log and count a dropped episode (too many in a row raise `EpisodeFailures`), then hand it over."""
        self.failures.dropped(failure)
        on_result(EpisodeResult.failed(failure))

    def _finished(self, item: _Live, outcome: object, on_result: Callable[[EpisodeResult], None]) -> None:
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
        """Episodes dropped because a plugin failed, over the runner's life."""
        return self.failures.failed

    @property
    def live(self) -> int:
        """Episodes started and not ended."""
        return len(self._waiting) + len(self._running)

    # ---- weights may change only on an idle engine (see the module docstring) ---------------------------

    def in_progress(self, model: str) -> int:
        """Requests of `model` whose generation has started and not ended: its engine's, or, on an engine
        shared with other models (adapters), the requests of `model` submitted and not returned."""
        if model in self._shared:
            return sum(self._model_of(item) == model for item in self._running.values())
        return self._requests[self._engine_of[model]].in_progress()

    def hold(self, model: str) -> None:
        """Submit nothing new to `model`'s engine until `release`: the running requests finish, then it idles."""
        self._held.add(model)

    def release(self, model: str) -> None:
        self._held.discard(model)

    def interrupt(self, model: str) -> None:
        """Abort what runs on `model`'s engine; those turns go back to be submitted again (same seeds)."""
        aborted = [rid for rid, item in self._running.items() if self._model_of(item) == model]
        if aborted:
            self._requests[self._engine_of[model]].abort(aborted)
        for rid in aborted:
            item = self._running.pop(rid)
            item.submitted = ""
            self._waiting.append(item)

    # ---- the loop ------------------------------------------------------------------------------------

    def _model_of(self, item: _Live) -> str:
        return self.agents[item.turn.agent].model

    def _engine_key(self, item: _Live) -> str:
        return self.agents[item.turn.agent].engine_key

    def _specs(self, item: _Live) -> Mapping[str, AgentSpec]:
        return item.request.agents or self.agents

    def _submit_waiting(self, on_result: Callable[[EpisodeResult], None]) -> None:
        """Submit every waiting agent turn whose engine is not held; a turn the engine refuses (or whose
        messages cannot be encoded) is thrown into its episode."""
        still_waiting: list[_Live] = []
        for item in self._waiting:
            if isinstance(item.turn, ToolCall):  # waits on a tool answer that is not there yet
                still_waiting.append(item)
                continue
            model = self._model_of(item)
            if model in self._held:
                still_waiting.append(item)
                continue
            key = self._engine_key(item)
            try:
                prompt = self._encode(self.engines[key], item.turn)
                params = self._sampling(item)
                self._requests[key].submit(item.request_id, prompt, params)
            except Exception as exc:
                refused = exc
            else:
                item.submitted, item.prompt_ids, item.params = item.request_id, prompt, params
                self._running[item.submitted] = item
                continue
            # outside the handler: what the episode raises next is its own error, not one "during" this one
            self._advance(item, None, still_waiting, on_result, error=refused)
        self._waiting = still_waiting

    def _step_engines(self, on_result: Callable[[EpisodeResult], None]) -> None:
        """Step every engine with requests; episodes whose turn came back go on (all at once with `barrier`)."""
        finished: list[tuple[_Live, str, Generation]] = []
        while True:
            for key, engine in self._requests.items():
                if not any(self._engine_key(item) == key for item in self._running.values()):
                    continue
                for request_id, generation in engine.step():
                    item = self._running.pop(request_id)
                    finished.append((item, self._model_of(item), generation))
            if not self.barrier or not self._running:
                break
        for item, model, generation in finished:
            turn: AgentTurn = item.turn  # type: ignore[assignment]
            item.calls.append(Call(turn.agent, model, item.prompt_ids, generation, item.params.temperature))
            item.submitted = ""
            reply: object = generation.text
            if turn.detailed:
                reply = Reply(generation.text, len(item.prompt_ids), len(generation.token_ids),
                              generation.finish_reason, generation.version)
            self._advance(item, reply, self._waiting, on_result)

    def _call_tools(self, live: list[_Live], on_result: Callable[[EpisodeResult], None]) -> list[_Live]:
        """Answer every pending tool call, one batched call per tool, until each live episode waits on an
        agent turn (an episode may call tools several times in a row) or on an answer not there yet (PENDING:
        asked again next round); returns the episodes still live."""
        pending: list[_Live] = []
        while True:
            by_tool: dict[str, list[_Live]] = defaultdict(list)
            ready: list[_Live] = []
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

    def _tool_results(self, tool: str, items: list[_Live], on_result: Callable[[EpisodeResult], None]
                      ) -> list[tuple[_Live, object]]:
        """One batched call of `tool` for `items`; the episodes whose request it fails on are dropped."""
        results = call_isolated(tool, self.tools[tool].call_batch, [item.turn.request for item in items])
        answered = []
        for item, result in zip(items, results):
            if isinstance(result, ToolFailed):
                self._close(item)
                self._drop(EpisodeFailure(item.request, "tool", tool, result.at, result.error), on_result)
            else:
                answered.append((item, result))
        return answered

    def _wait_outside(self) -> None:
        """Sleep in the `wait_for_answers` of each tool whose answers come from outside (see the module
        docstring); returns at once when no episode waits on one."""
        by_tool: dict[str, list[object]] = defaultdict(list)
        for item in self._waiting:
            if isinstance(item.turn, ToolCall):
                by_tool[item.turn.tool].append(item.turn.request)
        for tool, requests in by_tool.items():
            wait = getattr(self.tools[tool], "wait_for_answers", None)
            if wait is not None:
                wait(requests)

    def _sampling(self, item: _Live) -> SamplingParams:
        return turn_sampling(self._specs(item)[item.turn.agent].sampling, item.turn.sampling,  # type: ignore[union-attr]
                             self.seed, f"{item.request.episode_id}:{len(item.calls)}")

    @staticmethod
    def _encode(engine: Engine, turn: AgentTurn) -> list[int]:
        return prompt_ids(engine.tokenizer, turn.messages, turn.tools)

    def _advance(
        self, item: _Live, response: object, live: list[_Live], on_result: Callable[[EpisodeResult], None],
        error: Optional[Exception] = None,
    ) -> None:
        """Send the response or tool result (None to start; or throw `error`, a turn the engine refused) and
        either queue what the episode asks for next or finish the episode. Scripted agents' turns are answered
        here, as they come."""
        while True:
            try:
                if error is not None:
                    item.turn, error = item.episode.throw(error), None  # type: ignore[attr-defined]
                else:
                    item.turn = item.episode.send(response)  # type: ignore[attr-defined]
                self._check_turn(item.turn)
            except StopIteration as stop:
                self._finished(item, stop.value, on_result)
                return
            except Exception as exc:
                at = f"agent {item.turn.agent!r}" if isinstance(item.turn, AgentTurn) else (
                    f"tool {item.turn.tool!r}" if isinstance(item.turn, ToolCall) else "")
                self._close(item)
                self._drop(EpisodeFailure(item.request, "orchestra", self._orchestra_name, at, exc), on_result)
                return
            if isinstance(item.turn, AgentTurn) and self._specs(item)[item.turn.agent].script is not None:
                try:
                    response = self._scripted(item)
                except Exception as exc:
                    self._close(item)
                    self._drop(EpisodeFailure(item.request, "scripted agent", item.turn.agent, "", exc), on_result)
                    return
                continue
            live.append(item)
            return

    def _check_turn(self, turn: object) -> None:
        if isinstance(turn, ToolCall):
            if turn.tool not in self.tools:
                raise ValueError(f"orchestra called tool {turn.tool!r} which it does not provide "
                                 f"(its tools: {sorted(self.tools) or 'none'})")
        elif not isinstance(turn, AgentTurn):
            raise TypeError(f"orchestra yielded {type(turn).__name__}, not an AgentTurn or a ToolCall")
        elif turn.agent not in self.agents:
            raise ValueError(f"orchestra asked for agent {turn.agent!r} which is not configured")

    @staticmethod
    def _close(item: _Live) -> None:
        """Close a dropped episode's generator (its `finally` blocks run); an error there changes nothing."""
        try:
            item.episode.close()  # type: ignore[attr-defined]
        except Exception:
            pass

    def _scripted(self, item: _Live) -> str:
        """The reply of a scripted agent to the turn `item` waits for, recorded as a call without a sample."""
        turn: AgentTurn = item.turn  # type: ignore[assignment]
        text = self._specs(item)[turn.agent].script(turn)  # type: ignore[misc]
        if not isinstance(text, str):
            raise TypeError(f"scripted agent {turn.agent!r} returned {type(text).__name__}, not the reply text")
        item.calls.append(Call(turn.agent, "", [], None))
        return text
