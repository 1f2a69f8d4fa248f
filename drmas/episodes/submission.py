"""Agent turns on their engines: submission, stepping, and the hold and release that weight loading needs.

Kept apart from the episode loop because it is the one part that knows engines: which engine serves a model
(several models may share one, as LoRA adapters of one base: `AgentSpec.engine`), what runs where, and how a
turn becomes a request (its prompt, its sampling: `drmas.episodes.turn_sampling`) and a returned generation
the episode's reply. A new engine ability belongs here.

Weights may only change on an engine with nothing in progress, or a response would mix versions. Between
engine steps a caller checks `in_progress(model)` and, while requests run, `hold(model)` (submit nothing new,
let the running ones finish) or `interrupt(model)` (abort them; they are submitted again afterwards, with their
own seeds, so nothing else changes), then `release(model)` once the weights are in. Holding, interrupting or
counting a model touches only its own requests on a shared engine.
"""

from __future__ import annotations

from typing import Mapping, Optional

from drmas.core.tool_calls import prompt_ids
from drmas.engines.base import Engine, Generation, SamplingParams, request_level
from drmas.mas.base import AgentTurn, Reply, ServiceCall
from drmas.episodes.samples import Call
from drmas.episodes.stepping import LiveEpisode
from drmas.episodes.turn_sampling import turn_sampling
from drmas.episodes.types import AgentSpec


class EngineRequests:
    """The engine requests of live episodes, by engine (one per engine key), and the models held."""

    def __init__(self, engines: Mapping[str, Engine], agents: Mapping[str, AgentSpec], seed: Optional[int]) -> None:
        for name, spec in agents.items():
            if spec.script is None and spec.engine_key not in engines:
                raise ValueError(f"agent {name!r} uses model {spec.model!r} which has no engine")
        self.engines, self.agents, self.seed = engines, agents, seed
        self._requests = {key: request_level(engine) for key, engine in engines.items()}
        self._engine_of = {spec.model: spec.engine_key for spec in agents.values() if spec.script is None}
        # models that share their engine with other models: their own requests are counted apart
        keys = list(self._engine_of.values())
        self._shared = {model for model, key in self._engine_of.items() if keys.count(key) > 1}
        self._held: set[str] = set()
        self._running: dict[str, LiveEpisode] = {}  # engine request id -> episode

    def reset(self) -> None:
        self._running, self._held = {}, set()

    @property
    def running(self) -> list[LiveEpisode]:
        """The episodes whose turn runs on an engine, in submission order."""
        return list(self._running.values())

    def __len__(self) -> int:
        return len(self._running)

    def can_submit(self, item: LiveEpisode) -> bool:
        """Whether the episode waits on an agent turn (not a service's answer) of a model that is not held."""
        return not isinstance(item.turn, ServiceCall) and self._model_of(item) not in self._held

    def submit(self, item: LiveEpisode) -> Optional[Exception]:
        """Submit the episode's turn; what refused it (the engine, or messages that cannot be encoded) is returned,
        not raised, so that the episode is not thrown the refusal inside this handler."""
        key = self._engine_key(item)
        try:
            prompt = encode(self.engines[key], item.turn)
            params = self._sampling(item)
            self._requests[key].submit(item.request_id, prompt, params)
        except Exception as exc:
            return exc
        item.submitted, item.prompt_ids, item.params = item.request_id, prompt, params
        self._running[item.submitted] = item
        return None

    def step(self, barrier: bool) -> list[tuple[LiveEpisode, str, Generation]]:
        """Step every engine with requests; the episodes whose turn came back, their model and its generation.
        With `barrier`, step again until every submitted turn is back (rounds)."""
        finished: list[tuple[LiveEpisode, str, Generation]] = []
        while True:
            for key, engine in self._requests.items():
                if not any(self._engine_key(item) == key for item in self._running.values()):
                    continue
                for request_id, generation in engine.step():
                    item = self._running.pop(request_id)
                    finished.append((item, self._model_of(item), generation))
            if not barrier or not self._running:
                return finished

    def abort(self, item: LiveEpisode) -> None:
        """Abort the episode's running request (it ends)."""
        del self._running[item.submitted]
        self._requests[self._engine_key(item)].abort([item.submitted])

    def abort_all(self) -> None:
        for key, engine in self._requests.items():
            running = [rid for rid, item in self._running.items() if self._engine_key(item) == key]
            if running:
                engine.abort(running)
        self._running = {}

    # ---- weights may change only on an idle engine (see the module docstring) ---------------------------

    def in_progress(self, model: str) -> int:
        """Requests of `model` whose generation has started and not ended: its engine's, or, on an engine
        shared with other models (adapters), the requests of `model` submitted and not returned."""
        if model in self._shared:
            return sum(self._model_of(item) == model for item in self._running.values())
        return self._requests[self._engine_of[model]].in_progress()

    def hold(self, model: str) -> None:
        self._held.add(model)

    def release(self, model: str) -> None:
        self._held.discard(model)

    def interrupt(self, model: str) -> list[LiveEpisode]:
        """Abort what runs of `model`; returns those episodes, to be submitted again (same seeds)."""
        aborted = [rid for rid, item in self._running.items() if self._model_of(item) == model]
        if aborted:
            self._requests[self._engine_of[model]].abort(aborted)
        items = [self._running.pop(rid) for rid in aborted]
        for item in items:
            item.submitted = ""
        return items

    def _model_of(self, item: LiveEpisode) -> str:
        return self.agents[item.turn.agent].model

    def _engine_key(self, item: LiveEpisode) -> str:
        return self.agents[item.turn.agent].engine_key

    def _sampling(self, item: LiveEpisode) -> SamplingParams:
        spec = (item.request.agents or self.agents)[item.turn.agent]  # type: ignore[union-attr]
        return turn_sampling(spec.sampling, item.turn.sampling, self.seed,  # type: ignore[union-attr]
                             f"{item.request.episode_id}:{len(item.calls)}")


def encode(engine: Engine, turn: AgentTurn) -> list[int]:
    """The prompt of an agent turn for `engine`: its messages and tools through the engine's chat template."""
    return prompt_ids(engine.tokenizer, turn.messages, turn.tools)


def returned(item: LiveEpisode, model: str, generation: Generation) -> object:
    """Record the episode's call that came back and return the reply its orchestra gets: the text, or a `Reply`
    when the turn asked for one (`AgentTurn.detailed`)."""
    turn: AgentTurn = item.turn  # type: ignore[assignment]
    item.calls.append(Call(turn.agent, model, item.prompt_ids, generation, item.params.temperature))
    item.submitted = ""
    if not turn.detailed:
        return generation.text
    return Reply(generation.text, len(item.prompt_ids), len(generation.token_ids), generation.finish_reason,
                 generation.version)
