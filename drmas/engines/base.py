"""The engine interface: one engine serves one model.

Everything above the engine (agents, orchestras, rollout loops) speaks only this interface, so the embedded
PyTorch engine, a vLLM engine and a remote engine are interchangeable. Prompts go in as token ids (the
caller owns chat templating via `engine.tokenizer`), so what is trained on is exactly what was sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()  # generation ends once the decoded response contains one (it is kept)
    seed: int | None = None  # per-request seed; None draws from the engine's generator


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
