"""Testing a system without a model: play its episodes on scripted replies and check what each turn would train on.

An orchestra is turn logic (a generator), so its rules (who is asked what, when the episode ends, which reward
each turn gets) can be checked with replies written by hand, in milliseconds, before any model is trained:

    from drmas.api.testing import ScriptedSystem

    with ScriptedSystem("my_system.yaml") as system:     # the config's plugins, task and orchestra; no model
        problem = system.problems()[0]
        played = system.play(["\\\\boxed{7}", "<verdict>accept</verdict>"], problem)
        assert played.agents_asked() == ["writer", "critic"]
        assert played.rewards == [1.0, 1.0]              # what each turn trains on, format penalty included

`play` answers each agent turn with the next reply of the script, a scripted role's turns with its `respond` (they
take no reply from the script), and each service call with the orchestra's real service. It raises `ScriptError`
when the episode asks for more replies than the script has, or ends before using them all. `rewards` are the
training rewards the episode driver gives each turn (per turn, per agent or the episode's, minus
`algorithm.invalid_penalty` for an invalid turn), refused as the driver refuses them: an `agent_rewards` key that
is not an agent, a reward that is not a finite number. `play_orchestra` does the same for an orchestra built by
hand. Nothing here needs pytest.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from drmas import assembly
from drmas.episodes.samples import turn_rewards
from drmas.mas.base import AgentTurn, EpisodeOutcome, Orchestra, ServiceCall
from drmas.tasks.base import Problem, Task


class ScriptError(AssertionError):
    """The script does not fit the episode: too few replies, or more than the episode asked for."""


@dataclass
class Transcript:
    """One played episode: the turns the orchestra asked for (scripted roles' included), in order, the service
    calls it made, its outcome, and each turn's training reward."""

    asked: list[AgentTurn]
    service_calls: list[ServiceCall]
    outcome: EpisodeOutcome
    rewards: list[float]  # one per turn: what its sample would carry (format penalty included)

    def agents_asked(self) -> list[str]:
        return [turn.agent for turn in self.asked]

    def rewards_of(self, agent: str) -> list[float]:
        """The training rewards of `agent`'s turns, in order."""
        return [r for turn, r in zip(self.outcome.turns, self.rewards) if turn.agent == agent]

    def prompt(self, index: int) -> str:
        """The last message of turn `index`'s request (what that agent was asked)."""
        return self.asked[index].messages[-1]["content"] if self.asked[index].messages else ""


def play_orchestra(orchestra: Orchestra, replies: Sequence[str], problem: Problem, *, invalid_penalty: float = 0.0,
                   agents: Optional[Sequence[str]] = None,
                   scripts: Optional[Mapping[str, Callable[[AgentTurn], str]]] = None) -> Transcript:
    """Play one episode of `orchestra` on `problem`: agent turns answered by `replies` in order, the agents named
    in `scripts` by their function instead, service calls by the orchestra's services. `agents` (default: the
    orchestra's) are the names `agent_rewards` may use."""
    scripts = dict(scripts or {})
    services = getattr(orchestra, "services", {}) or {}
    episode = orchestra.run(problem)
    asked: list[AgentTurn] = []
    calls: list[ServiceCall] = []
    script = list(replies)
    used = 0
    answer: object = None
    try:
        while True:
            request = episode.send(answer)
            if isinstance(request, ServiceCall):
                if request.service not in services:
                    raise ScriptError(f"the episode called service {request.service!r}; the orchestra has "
                                      f"{sorted(services) or 'none'}")
                calls.append(request)
                answer = services[request.service].call_batch([request.request])[0]
                continue
            asked.append(request)
            if request.agent in scripts:
                answer = scripts[request.agent](request)
                continue
            if used == len(script):
                raise ScriptError(f"the episode asked {request.agent!r} for reply {used + 1}; the script has {used}")
            answer, used = script[used], used + 1
    except StopIteration as done:
        outcome = done.value
    if used < len(script):
        raise ScriptError(f"the episode ended after {used} of the script's {len(script)} replies")
    if not isinstance(outcome, EpisodeOutcome):
        raise ScriptError(f"the episode returned {type(outcome).__name__}, not an EpisodeOutcome")
    if len(outcome.turns) != len(asked):
        raise ScriptError(f"the outcome has {len(outcome.turns)} turns for the {len(asked)} the episode asked for")
    names = list(agents if agents is not None else getattr(orchestra, "agents", ()))
    base = turn_rewards(outcome, dict.fromkeys(names), f"the episode on {problem.uid}")
    rewards = [r - (0.0 if turn.valid else invalid_penalty) for r, turn in zip(base, outcome.turns)]
    return Transcript(asked=asked, service_calls=calls, outcome=outcome, rewards=rewards)


class ScriptedSystem:
    """A config's system as training builds it (its plugins imported, its task and orchestra built, its settings
    checked), without a model or an engine: `play` episodes on scripted replies. Close it (or use `with`) to
    release what the orchestra holds."""

    def __init__(self, config: str | Path, overrides: Sequence[str] = ()) -> None:
        self.cfg = assembly.load_config(config, list(overrides))
        self.task: Task = assembly.build_task(self.cfg)
        self.orchestra: Orchestra = assembly.build_orchestra(self.cfg, self.task)
        self.scripts = {name: spec.script for name, spec in assembly.agent_specs(self.cfg).items() if spec.script}

    def problems(self, split: str = "train") -> list[Problem]:
        return self.task.split(split)

    def play(self, replies: Sequence[str], problem: Optional[Problem] = None) -> Transcript:
        """One episode on `problem` (default: the first training problem) with the config's agents, scripted roles
        and format penalty."""
        return play_orchestra(self.orchestra, replies, problem or self.problems()[0],
                              invalid_penalty=self.cfg.algorithm.invalid_penalty, agents=list(self.cfg.agents),
                              scripts=self.scripts)

    def close(self) -> None:
        assembly.close_orchestra(self.orchestra)

    def __enter__(self) -> "ScriptedSystem":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
