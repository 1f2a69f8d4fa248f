"""The Revise system (solver, task-graded check, reviser on a wrong answer), driven by hand on the real
arithmetic task: each test plays the LLMs with scripted replies and checks who was asked what and the
outcome. The checker is the task's real grader, so "wrong" and "right" are the task's own verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from drmas.api.testing import play_orchestra as drive
from drmas.assembly import build_orchestra
from drmas.config.systems import ReviseSettings
from drmas.config.tasks import ArithmeticSettings
from drmas.mas import ORCHESTRAS
from drmas.mas.revise import ReviseOrchestra, checker_feedback
from drmas.tasks import build_task

ROLES = {"solver": "sol", "reviser": "rev"}
TASK = build_task(ArithmeticSettings(seed=0, n_train=8, n_test=2, max_value=6, operations="+"))
PROBLEM = TASK.split("train")[0]
RIGHT = f"The answer is \\boxed{{{PROBLEM.answer}}}."
WRONG = f"The answer is \\boxed{{{int(PROBLEM.answer) + 1}}}."


def make(max_rounds: int = 2) -> ReviseOrchestra:
    return ReviseOrchestra(ReviseSettings(max_rounds=max_rounds), ROLES, TASK)


def test_a_right_first_answer_never_calls_the_reviser() -> None:
    t = drive(make(), [RIGHT], PROBLEM)
    assert t.agents_asked() == ["sol"]
    assert t.outcome.reward == 1.0
    assert t.outcome.info == {"attempts": 1, "revised": False, "first_correct": True}
    assert t.outcome.final_answer == PROBLEM.answer


def test_a_wrong_answer_goes_to_the_reviser_with_the_checkers_verdict_but_not_the_answer() -> None:
    t = drive(make(), [WRONG, RIGHT], PROBLEM)
    assert t.agents_asked() == ["sol", "rev"]
    request = t.asked[1].messages[-1]["content"]
    assert WRONG in request and checker_feedback(WRONG) in request
    assert f"{int(PROBLEM.answer) + 1} is wrong" in request
    assert f"\\boxed{{{PROBLEM.answer}}}" not in request
    assert t.outcome.reward == 1.0 and t.outcome.info["revised"] and not t.outcome.info["first_correct"]
    assert [(turn.agent, turn.valid) for turn in t.outcome.turns] == [("sol", True), ("rev", True)]


def test_the_reward_is_the_last_answers_grade_and_attempts_are_bounded() -> None:
    t = drive(make(max_rounds=3), [WRONG, "no box here", WRONG], PROBLEM)
    assert t.agents_asked() == ["sol", "rev", "rev"]
    assert t.outcome.reward == 0.0 and t.outcome.info["attempts"] == 3
    assert [turn.valid for turn in t.outcome.turns] == [True, False, True]
    # the second reviser call sees the reviser's own previous answer; an unboxed one is quoted whole
    assert "The answer no box here is wrong." in t.asked[2].messages[-1]["content"]


def test_one_attempt_means_solver_only() -> None:
    t = drive(make(max_rounds=1), [WRONG], PROBLEM)
    assert t.agents_asked() == ["sol"] and t.outcome.reward == 0.0


def test_registered_and_built_from_a_config_naming_missing_roles() -> None:
    assert ORCHESTRAS.get("math_revise") is ReviseOrchestra
    from drmas.config import read_config

    cfg = read_config(str(Path(__file__).resolve().parents[1] / "configs" / "stability.yaml"), [])
    orchestra = build_orchestra(cfg, build_task(cfg.task))
    assert orchestra.agents == ("solver", "reviser")
    with pytest.raises(ValueError, match="role 'reviser'"):
        ReviseOrchestra(ReviseSettings(), {"solver": "sol"}, TASK)
