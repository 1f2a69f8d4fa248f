"""What the episode driver takes and gives: how an agent is served (`AgentSpec`), an episode to run
(`EpisodeRequest`) and what it became (`EpisodeResult`). Value types only, apart from the driver
(`drmas.episodes.runner`), so that whatever builds or reads them need not import the driver."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

from drmas.core.sample import Sample
from drmas.engines.base import SamplingParams
from drmas.episodes.failures import EpisodeFailure
from drmas.mas.base import AgentTurn, EpisodeOutcome
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
