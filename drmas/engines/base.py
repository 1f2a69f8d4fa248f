"""The engine interface: one engine serves one model.

Everything above the engine (agents, orchestras, rollout loops) speaks only this interface, so the embedded
PyTorch engine, a vLLM engine and a remote engine are interchangeable. Prompts go in as token ids (the
caller owns chat templating via `engine.tokenizer`), so what is trained on is exactly what was sampled.

Two ways in. `generate` samples a batch and returns when all of it is done. The request level (`submit`,
then `step` until the request comes back) is what lets a multi-turn driver hand an episode's next turn to
the engine the moment its previous turn returns, so an engine with continuous batching (vLLM) never waits
for the slowest episode of a round. An engine that only batches (`generate`) gets the request level from
`PendingBatch`: each `step` generates everything submitted since the last one, in one batch.

An engine may serve LoRA adapters of its model (`AdapterEngine`, docs/lora.md): one copy of the base, every
request naming its adapter (`SamplingParams.adapter`), each adapter loaded and versioned on its own
(`load_adapter`). `AdapterSlot` is one adapter of such an engine as a weight receiver sees it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch

from drmas.core.constraints import Constraint


@dataclass(frozen=True)
class EngineAbilities:
    """What an engine can do beyond the `Engine` protocol, declared where it registers
    (`ENGINES.register(name, traits=EngineAbilities(...))`), so the config check reads it without importing
    the engine (vLLM's import takes seconds, and it may not be installed where a config is checked)."""

    serves_adapters: bool = False  # LoRA adapters of its model: the factory takes `adapters=` (docs/lora.md)
    takes_engine_args: bool = False  # `rollout.engine_args` reach the factory (else setting them is an error)
    truncates_top_p: bool = False  # its log-probs are those of the top-p truncated distribution (train at top_p=1)
    needs: tuple[str, str] | None = None  # (module, how to install it): checked where it will run


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()  # generation ends once the decoded response contains one (it is kept)
    seed: int | None = None  # per-request seed; None draws from the engine's generator
    adapter: str = ""  # the LoRA adapter of the engine's model that samples it ('' = the model itself)
    constraint: Constraint | None = None  # what the response must be (constrained decoding): drmas.core.constraints


@dataclass
class Generation:
    """One sampled response."""

    token_ids: list[int]
    logprobs: list[float]  # log-prob of each sampled token under softmax(logits / temperature)
    text: str
    finish_reason: str  # "stop" (EOS or stop string) or "length"
    version: int  # engine weight version that produced every token of this response
    incarnation: str = ""  # the learner process that published that version ('' = the initial weights)


def check_request(prompt: list[int], params: SamplingParams, max_positions: int | None, limit_name: str) -> None:
    """Refuse a request no engine can honour, with a message that says why (every engine checks the same)."""
    if len(prompt) == 0:
        raise ValueError("empty prompt: at least one token is needed")
    if params.max_new_tokens < 0 or params.temperature < 0 or not 0 < params.top_p <= 1:
        raise ValueError(f"invalid sampling params {params}")
    if max_positions and len(prompt) + params.max_new_tokens > max_positions:
        raise ValueError(f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                         f"{limit_name} {max_positions}")


@runtime_checkable
class Engine(Protocol):
    """A text generator for one model whose weights can be replaced in place."""

    model_id: str
    tokenizer: object  # a transformers tokenizer (chat template, decode)

    @property
    def version(self) -> int: ...

    def generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Sample one response per prompt (params[i] applies to prompts[i]); batched inside."""
        ...

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, incarnation: str = ""
    ) -> None:
        """Replace (a subset of) the weights by name and set the version (and the incarnation of the learner
        that published it) the next tokens are stamped with."""
        ...


@runtime_checkable
class RequestEngine(Protocol):
    """The request level of an engine (see the module docstring)."""

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Queue one request; its generation comes back from a later `step`."""
        ...

    def step(self) -> list[tuple[str, Generation]]:
        """Advance the submitted requests; returns those that finished, by request id."""
        ...

    def in_progress(self) -> int:
        """Requests whose generation has started and not ended: weights loaded now would mix versions."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Forget submitted requests (their partial generations are lost; submit them again to redo them)."""
        ...


class PendingBatch:
    """The request level of an engine that only generates batches: `step` generates, in one batch, all that
    was submitted since the last `step`. Between steps nothing is half-generated."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._queued: list[tuple[str, list[int], SamplingParams]] = []

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        self._queued.append((request_id, prompt, params))

    def step(self) -> list[tuple[str, Generation]]:
        queued, self._queued = self._queued, []
        if not queued:
            return []
        generations = self.engine.generate([prompt for _, prompt, _ in queued], [params for *_, params in queued])
        return [(request_id, generation) for (request_id, _, _), generation in zip(queued, generations)]

    def in_progress(self) -> int:
        return 0

    def abort(self, request_ids: Sequence[str]) -> None:
        gone = set(request_ids)
        self._queued = [q for q in self._queued if q[0] not in gone]


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that serves LoRA adapters of its model from one copy of it (see the module docstring)."""

    def adapter_version(self, adapter: str) -> int:
        """Weight version of `adapter` stamped on the tokens it generates now."""
        ...

    def load_adapter(self, adapter: str, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                     incarnation: str = "") -> None:
        """Replace `adapter`'s tensors (peft's saved names, see `drmas.models.adapters`) and set its version;
        refused while requests of that adapter are in progress (the others go on)."""
        ...


class AdapterSlot:
    """One adapter of an `AdapterEngine`, with the `version` and `load_weights` of a whole engine: what a weight
    receiver applies an adapter's pushes to and what the rollout reports the version of."""

    def __init__(self, engine: AdapterEngine, adapter: str) -> None:
        if not isinstance(engine, AdapterEngine):
            raise TypeError(f"engine {type(engine).__name__} serves no LoRA adapters (adapter {adapter!r})")
        self.engine, self.adapter = engine, adapter

    @property
    def version(self) -> int:
        return self.engine.adapter_version(self.adapter)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int,
                     incarnation: str = "") -> None:
        self.engine.load_adapter(self.adapter, named_tensors, version, incarnation)


def request_level(engine: Engine) -> RequestEngine:
    """`engine` itself when it takes requests one by one, else its `PendingBatch`."""
    return engine if isinstance(engine, RequestEngine) else PendingBatch(engine)
