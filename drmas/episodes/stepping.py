"""An episode between two engine turns or service calls: the plugin side of the episode driver.

`Stepper.advance` takes a live episode from the reply it waits for (or from its start) to what it asks an
engine or a service for next: it sends the reply into the orchestra's generator (or throws the engine's refusal
in), checks the turn it yields, counts it against the episode's bounds (`drmas.episodes.bounds`) and answers a
scripted agent's turn at once, in the same step. It touches nothing but its own episode, so the runner runs it
in the plugin thread (`drmas.episodes.plugin_thread`) and can abandon it there when it blocks; the runner acts
on what it returns (`Ended`, `Failed`, or None: the episode waits on `item.turn`) in its own thread.
`item.plugin` says which plugin's code the episode is in, for a call that gets stuck.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Optional

from drmas.engines.base import SamplingParams
from drmas.mas.base import AgentTurn, Orchestra, ServiceCall
from drmas.episodes.bounds import Budget
from drmas.episodes.samples import Call

if TYPE_CHECKING:
    from drmas.episodes import AgentSpec, EpisodeRequest


@dataclass
class LiveEpisode:
    request: EpisodeRequest
    budget: Budget
    episode: object = None  # the orchestra's generator, once started
    turn: AgentTurn | ServiceCall | None = None  # what the episode waits for
    calls: list[Call] = field(default_factory=list)
    submitted: str = ""  # the engine request id of `turn` while it runs
    prompt_ids: list[int] = field(default_factory=list)  # of `turn`, once submitted
    params: Optional[SamplingParams] = None  # of `turn`, once submitted
    plugin: tuple[str, str, object] = ("", "", None)  # the plugin code it is in: kind, name, where (`at`)

    @property
    def request_id(self) -> str:
        return f"{self.request.episode_id}/{len(self.calls)}"


@dataclass(frozen=True)
class Ended:
    value: object  # what the generator returned (an EpisodeOutcome, unless the orchestra is wrong)


@dataclass(frozen=True)
class Failed:
    kind: str  # the plugin that failed: orchestra, scripted agent
    name: str
    at: str
    error: BaseException


class Stepper:
    def __init__(self, orchestra: Orchestra, name: str, agents: Mapping[str, AgentSpec],
                 services: Mapping[str, object]):
        self.orchestra, self.name, self.agents, self.services = orchestra, name, agents, services

    def advance(self, item: LiveEpisode, response: object, error: Optional[Exception] = None) -> Ended | Failed | None:
        """Send `response` (None to start; or throw `error`, a turn the engine refused) and go on to the episode's
        next engine turn or service call (None: it waits on `item.turn`), its end, or its failure."""
        if item.episode is None:
            item.plugin = ("orchestra", self.name, "start")
            try:
                item.episode = self.orchestra.run(item.request.problem)
            except Exception as exc:
                return Failed("orchestra", self.name, "start", exc)
        specs = item.request.agents or self.agents
        while True:
            item.plugin = ("orchestra", self.name, item.turn)
            try:
                if error is not None:
                    item.turn, error = item.episode.throw(error), None  # type: ignore[attr-defined]
                else:
                    item.turn = item.episode.send(response)  # type: ignore[attr-defined]
                self._check_turn(item.turn)
            except StopIteration as stop:
                return Ended(stop.value)
            except Exception as exc:
                return Failed("orchestra", self.name, at(item.turn), exc)
            over = item.budget.count(item.turn)
            if over is not None:
                over.stack = generator_stack(item.episode)
                return Failed("orchestra", self.name, at(item.turn), over)
            turn = item.turn
            if not isinstance(turn, AgentTurn) or specs[turn.agent].script is None:
                return None
            item.plugin = ("scripted agent", turn.agent, None)
            try:
                response = specs[turn.agent].script(turn)  # type: ignore[misc]
                if not isinstance(response, str):
                    raise TypeError(f"scripted agent {turn.agent!r} returned {type(response).__name__}, not the "
                                    "reply text")
            except Exception as exc:
                return Failed("scripted agent", turn.agent, "", exc)
            item.calls.append(Call(turn.agent, "", [], None))  # a turn without a sample

    def _check_turn(self, turn: object) -> None:
        if isinstance(turn, ServiceCall):
            if turn.service not in self.services:
                raise ValueError(f"orchestra called service {turn.service!r} which it does not provide "
                                 f"(its services: {sorted(self.services) or 'none'})")
        elif not isinstance(turn, AgentTurn):
            raise TypeError(f"orchestra yielded {type(turn).__name__}, not an AgentTurn or a ServiceCall")
        elif turn.agent not in self.agents:
            raise ValueError(f"orchestra asked for agent {turn.agent!r} which is not configured")


def at(where: object) -> str:
    """What an episode was at, for a failure's message: the turn it yielded last, or a place's name."""
    if isinstance(where, AgentTurn):
        return f"agent {where.agent!r}"
    if isinstance(where, ServiceCall):
        return f"service {where.service!r}"
    return where if isinstance(where, str) else ""


def generator_stack(episode: object) -> traceback.StackSummary:
    """Where an episode's generator is: its frame and those of the generators it delegates to (`yield from`)."""
    frames = []
    while getattr(episode, "gi_frame", None) is not None:
        frame = episode.gi_frame  # type: ignore[attr-defined]
        frames.append((frame, frame.f_lineno))
        episode = getattr(episode, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(frames)
