"""drmas.api.testing: a system played on scripted replies, with the rewards each turn would train on."""

from __future__ import annotations

from pathlib import Path

import pytest

from drmas.api import AgentTurn, EpisodeOutcome, Problem, TurnResult
from drmas.api.testing import ScriptedSystem, ScriptError, play_orchestra

TOY = Path(__file__).resolve().parent / "fixtures" / "plugins" / "toy.yaml"


@pytest.fixture(scope="module")
def toy():
    with ScriptedSystem(TOY) as system:
        yield system


def test_a_wrong_then_right_episode_with_its_service_calls_scripted_turns_and_penalties(toy) -> None:
    problem = toy.problems()[0]
    wrong = str(int(problem.answer) + 1)
    played = toy.play([f"\\boxed{{{wrong}}}", f"\\boxed{{{problem.answer}}}", "no verdict"], problem)
    assert played.agents_asked() == ["proposer", "referee", "proposer", "referee", "checker"]
    assert [call.service for call in played.service_calls] == ["calc", "calc"]  # the real service, each attempt
    assert played.prompt(2).endswith("Referee: wrong, try again")  # the scripted referee's reply reached the team
    penalty = toy.cfg.algorithm.invalid_penalty
    # proposer: the grade of its last proposal; checker: no verdict agrees with nothing, minus the format penalty
    assert played.rewards_of("proposer") == [1.0, 1.0] and played.rewards_of("checker") == [0.0 - penalty]


def test_a_script_that_does_not_fit_the_episode_is_named(toy) -> None:
    problem = toy.problems()[0]
    with pytest.raises(ScriptError, match="asked 'checker' for reply 2; the script has 1"):
        toy.play([f"\\boxed{{{problem.answer}}}"], problem)
    with pytest.raises(ScriptError, match="ended after 2 of the script's 3 replies"):
        toy.play([f"\\boxed{{{problem.answer}}}", "<verify>approve</verify>", "one too many"], problem)


class _Misnamed:
    """Rewards keyed by role, not agent name: the driver refuses it, and so does the harness."""

    agents = ("alice",)
    services: dict = {}

    def run(self, problem: Problem):
        text = yield AgentTurn("alice", [{"role": "user", "content": problem.question}])
        return EpisodeOutcome(reward=1.0, turns=[TurnResult("alice", text, True)], agent_rewards={"solver": 1.0})


def test_rewards_the_driver_would_refuse_are_refused() -> None:
    with pytest.raises(RuntimeError, match=r"agent_rewards for \['solver'\].*key them by agent name"):
        play_orchestra(_Misnamed(), ["hi"], Problem("p", "q?", "a"))
