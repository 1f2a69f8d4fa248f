"""Drive many multi-agent episodes at once and batch their LLM calls per engine.

Each orchestra episode is a generator waiting on one agent turn. Every round, the runner gathers the
pending turns of all live episodes, groups them by the model that serves the agent, makes one batched
`generate` call per engine, and sends each episode its response. Episodes of different lengths simply
finish at different rounds. The result is one `Sample` per agent call, rewards filled in. Tool calls
(`ToolCall`, e.g. retrievals) are batched the same way, one call per tool for all the episodes waiting on
it, before each round's generation.

`run` drives a fixed set of episodes to their end (training steps, evaluation). `stream` keeps a rollout
process busy instead: before every round it asks for new episodes, so finished ones are replaced at once,
and hands each episode over the moment it ends. The `on_round` hook runs between rounds, the one point
where no generation is in progress, which is where a rollout process swaps in new weights.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from drmas.engines.base import Engine, Generation, SamplingParams
from drmas.mas.base import AgentTurn, EpisodeOutcome, Orchestra, ToolCall
from drmas.protocol import Sample
from drmas.tasks.base import Problem


@dataclass(frozen=True)
class AgentSpec:
    """How one agent is served: its model id and its sampling parameters."""

    model: str
    sampling: SamplingParams


@dataclass
class EpisodeRequest:
    """One episode to run: which problem, which GRPO group it belongs to, its unique id."""

    episode_id: str
    group_id: str
    problem: Problem


@dataclass
class EpisodeResult:
    request: EpisodeRequest
    outcome: EpisodeOutcome
    samples: list[Sample] = field(default_factory=list)


@dataclass
class _Call:
    agent: str
    model: str
    prompt_ids: list[int]
    generation: Generation


@dataclass
class _Live:
    request: EpisodeRequest
    episode: object  # the orchestra's generator
    turn: AgentTurn | ToolCall  # what the episode waits for
    calls: list[_Call] = field(default_factory=list)


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
    ) -> None:
        """With `seed`, every call is sampled from its own stream derived from (seed, episode id, turn):
        the same episode samples the same tokens whatever else shares its batch, and a resumed run
        continues exactly as an uninterrupted one would.

        `on_round`, if given, is called before every decode round (never during one). Live episodes keep
        going across it, so it may replace an engine's weights: later turns then carry the new version."""
        missing = [a for a in orchestra.agents if a not in agents]
        if missing:
            raise ValueError(f"the orchestra needs agents {missing} that are not configured")
        for name, spec in agents.items():
            if spec.model not in engines:
                raise ValueError(f"agent {name!r} uses model {spec.model!r} which has no engine")
        self.orchestra = orchestra
        self.tools = dict(getattr(orchestra, "tools", None) or {})
        self.engines = engines
        self.agents = agents
        self.invalid_penalty = invalid_penalty
        self.seed = seed
        self.on_round = on_round

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

        Before every round `admit(number of live episodes)` returns the episodes to start now (possibly
        none), or None once no more will come. When nothing is live, `admit` is called again at once, so it
        should wait a little itself rather than return an empty list immediately. Every finished episode
        goes to `on_result` as soon as it ends. An exception from either callback (or `on_round`) ends the
        stream; episodes still live are then abandoned.
        """
        live: list[_Live] = []
        more = True
        while more or live:
            if more:
                new = admit(len(live))
                more = new is not None
                for req in new or ():
                    episode = self.orchestra.run(req.problem)
                    self._advance(_Live(req, episode, turn=None), None, live, on_result)  # type: ignore[arg-type]
            if not live:
                continue
            if self.on_round is not None:
                self.on_round()
            live = self._round(live, on_result)

    def _round(self, live: list[_Live], on_result: Callable[[EpisodeResult], None]) -> list[_Live]:
        """Pending tool calls first, then one batched generate call per engine for the pending agent turns;
        returns the episodes still live."""
        live = self._call_tools(live, on_result)
        by_model: dict[str, list[_Live]] = defaultdict(list)
        for item in live:
            by_model[self.agents[item.turn.agent].model].append(item)
        still_live: list[_Live] = []
        for model, items in by_model.items():
            responses = self._generate(model, items)
            for item, (prompt_ids, gen) in zip(items, responses):
                item.calls.append(_Call(item.turn.agent, model, prompt_ids, gen))
                self._advance(item, gen.text, still_live, on_result)
        return still_live

    def _call_tools(self, live: list[_Live], on_result: Callable[[EpisodeResult], None]) -> list[_Live]:
        """Answer every pending tool call, one batched call per tool, until each live episode waits on an
        agent turn (an episode may call tools several times in a row); returns the episodes still live."""
        while True:
            by_tool: dict[str, list[_Live]] = defaultdict(list)
            ready: list[_Live] = []
            for item in live:
                if isinstance(item.turn, ToolCall):
                    by_tool[item.turn.tool].append(item)
                else:
                    ready.append(item)
            if not by_tool:
                return live
            for tool, items in by_tool.items():
                results = self.tools[tool].call_batch([item.turn.request for item in items])
                if len(results) != len(items):
                    raise RuntimeError(f"tool {tool!r} returned {len(results)} results for {len(items)} requests")
                for item, result in zip(items, results):
                    self._advance(item, result, ready, on_result)
            live = ready

    def _generate(self, model: str, items: list[_Live]) -> list[tuple[list[int], Generation]]:
        engine = self.engines[model]
        prompts = [self._encode(engine, item.turn) for item in items]
        params = [self._sampling(item) for item in items]
        return list(zip(prompts, engine.generate(prompts, params)))

    def _sampling(self, item: _Live) -> SamplingParams:
        params = self.agents[item.turn.agent].sampling
        if self.seed is None:
            return params
        key = f"{self.seed}:{item.request.episode_id}:{len(item.calls)}".encode()
        return dataclasses.replace(params, seed=zlib.crc32(key))

    @staticmethod
    def _encode(engine: Engine, turn: AgentTurn) -> list[int]:
        ids = engine.tokenizer.apply_chat_template(turn.messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):  # BatchEncoding in newer transformers
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def _advance(
        self, item: _Live, response: object, live: list[_Live], on_result: Callable[[EpisodeResult], None]
    ) -> None:
        """Send the response or tool result (None to start) and either queue what the episode asks for
        next or finish the episode."""
        try:
            item.turn = item.episode.send(response)  # type: ignore[attr-defined]
        except StopIteration as stop:
            outcome: EpisodeOutcome = stop.value
            on_result(EpisodeResult(item.request, outcome, self._samples(item, outcome)))
            return
        if isinstance(item.turn, ToolCall):
            if item.turn.tool not in self.tools:
                raise ValueError(f"orchestra called tool {item.turn.tool!r} which it does not provide "
                                 f"(its tools: {sorted(self.tools) or 'none'})")
        elif item.turn.agent not in self.agents:
            raise ValueError(f"orchestra asked for agent {item.turn.agent!r} which is not configured")
        live.append(item)

    def _samples(self, item: _Live, outcome: EpisodeOutcome) -> list[Sample]:
        if len(outcome.turns) != len(item.calls):
            raise RuntimeError(
                f"orchestra reported {len(outcome.turns)} turns for {len(item.calls)} calls in episode "
                f"{item.request.episode_id}"
            )
        samples = []
        for index, (call, turn) in enumerate(zip(item.calls, outcome.turns)):
            reward = outcome.reward - self.invalid_penalty * (0.0 if turn.valid else 1.0)
            samples.append(
                Sample(
                    episode_id=item.request.episode_id,
                    group_id=item.request.group_id,
                    agent=call.agent,
                    model=call.model,
                    turn=index,
                    prompt_ids=call.prompt_ids,
                    response_ids=call.generation.token_ids,
                    behaviour_logprobs=call.generation.logprobs,
                    policy_version=call.generation.version,
                    policy_incarnation=call.generation.incarnation,
                    temperature=self.agents[call.agent].sampling.temperature,
                    valid=turn.valid,
                    reward=reward,
                    episode_reward=outcome.reward,
                )
            )
        return samples
