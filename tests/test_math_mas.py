"""The Math solver/verifier orchestra, driven by hand.

Each test plays the LLM: it feeds scripted response texts into the orchestra's generator, exactly as the
rollout driver does, and checks which agent was asked, with what prompt, and the returned outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from drmas.api.testing import Transcript
from drmas.api.testing import play_orchestra as _drive
from drmas.config.systems import MathSettings
from drmas.mas import ORCHESTRAS, AgentTurn
from drmas.mas.agents import AGENT_ROLES, SolverAgent, TeamContext, VerifierAgent
from drmas.mas.math import MathOrchestra
from drmas.tasks.base import Problem

PROBLEM = Problem("p0", "Mia has 7 apples and buys 5 more. How many apples does she have now?", "12")
ROLES = {"solver": "alice", "verifier": "bob"}

RIGHT = "7 + 5 = 12. \\boxed{12}"
WRONG = "7 + 5 = 13. \\boxed{13}"
NO_BOX = "She has 12 apples."
APPROVE = "7 + 5 = 12. <verify>approve</verify>"
REJECT = "7 + 5 is 12, not 13. <verify>reject</verify>"
MALFORMED = "Looks fine to me."


def drive(orchestra, responses: list[str], problem: Problem = PROBLEM) -> Transcript:
    return _drive(orchestra, responses, problem)


@dataclass
class SubstringTask:
    """Test double of a Task: a response is correct when it contains the gold answer in a box."""

    name: str = "fake"
    graded: list[str] = field(default_factory=list)

    def split(self, name: str) -> list[Problem]:
        return [PROBLEM]

    def grade(self, problem: Problem, response: str) -> float:
        self.graded.append(response)
        return 1.0 if f"\\boxed{{{problem.answer}}}" in response else 0.0


def make(max_rounds: int = 2, malformed_verdict: str = "approve", task: SubstringTask | None = None) -> MathOrchestra:
    """A math orchestra over the scripted agents alice (solver) and bob (verifier)."""
    cfg = MathSettings(max_rounds=max_rounds, malformed_verdict=malformed_verdict)
    return MathOrchestra(cfg, ROLES, task or SubstringTask())


def user_text(turn: AgentTurn) -> str:
    return turn.messages[-1]["content"]


# --- episode flow -------------------------------------------------------------------------------------------


def test_approve_in_round_one_ends_after_two_calls() -> None:
    t = drive(make(max_rounds=3), [RIGHT, APPROVE])
    assert t.agents_asked() == ["alice", "bob"]
    assert t.outcome.info["rounds"] == 1
    assert t.outcome.info["approved"] is True
    assert t.outcome.info["verifier_calls"] == 1
    assert t.outcome.reward == 1.0
    assert t.outcome.final_answer == "12"


def test_reject_then_last_round_has_no_verifier() -> None:
    t = drive(make(max_rounds=2), [WRONG, REJECT, RIGHT])
    assert t.agents_asked() == ["alice", "bob", "alice"]
    assert t.outcome.info == {"rounds": 2, "approved": False, "verifier_calls": 1, "malformed_verdicts": 0}
    assert t.outcome.reward == 1.0


def test_three_rounds_with_two_rejects() -> None:
    t = drive(make(max_rounds=3), [WRONG, REJECT, WRONG, REJECT, RIGHT])
    assert t.agents_asked() == ["alice", "bob", "alice", "bob", "alice"]
    assert t.outcome.info["rounds"] == 3
    assert t.outcome.info["verifier_calls"] == 2


def test_single_round_is_solver_only() -> None:
    t = drive(make(max_rounds=1), [RIGHT])
    assert t.agents_asked() == ["alice"]
    assert t.outcome.info["verifier_calls"] == 0


# --- malformed verdicts ---------------------------------------------------------------------------------------


def test_malformed_verdict_counts_as_approve_by_default() -> None:
    t = drive(make(max_rounds=2), [WRONG, MALFORMED])
    assert t.agents_asked() == ["alice", "bob"]
    assert t.outcome.info["approved"] is True
    assert t.outcome.info["malformed_verdicts"] == 1
    assert [turn.valid for turn in t.outcome.turns] == [True, False]


def test_malformed_verdict_can_count_as_reject() -> None:
    t = drive(make(max_rounds=2, malformed_verdict="reject"), [WRONG, MALFORMED, RIGHT])
    assert t.agents_asked() == ["alice", "bob", "alice"]
    assert t.outcome.info["approved"] is False
    assert t.outcome.info["malformed_verdicts"] == 1
    assert [turn.valid for turn in t.outcome.turns] == [True, False, True]


# --- validity and reward --------------------------------------------------------------------------------------


def test_turns_record_agent_text_and_validity_in_order() -> None:
    t = drive(make(max_rounds=3), [NO_BOX, REJECT, RIGHT, "<VERIFY> Approve </Verify>"])
    assert [(r.agent, r.text, r.valid) for r in t.outcome.turns] == [
        ("alice", NO_BOX, False),
        ("bob", REJECT, True),
        ("alice", RIGHT, True),
        ("bob", "<VERIFY> Approve </Verify>", True),
    ]
    assert t.outcome.info["approved"] is True


def test_reward_grades_the_final_solver_answer_only() -> None:
    task = SubstringTask()
    t = drive(make(max_rounds=2, task=task), [RIGHT, REJECT, WRONG])
    assert task.graded == [WRONG]
    assert t.outcome.reward == 0.0
    assert t.outcome.final_answer == "13"


def test_final_answer_is_empty_without_a_box() -> None:
    t = drive(make(max_rounds=1), [NO_BOX])
    assert t.outcome.final_answer == ""
    assert t.outcome.reward == 0.0


# --- prompts and team context ---------------------------------------------------------------------------------


def test_round_two_solver_sees_previous_answer_and_feedback() -> None:
    t = drive(make(max_rounds=2), [WRONG, REJECT, RIGHT])
    first, review, second = (user_text(turn) for turn in t.asked)
    assert PROBLEM.question in first and WRONG not in first
    assert PROBLEM.question in review and "Proposed answer: 13" in review
    assert PROBLEM.question in second
    assert WRONG in second and REJECT in second


def test_verifier_sees_an_unboxed_answer_whole() -> None:
    t = drive(make(max_rounds=2), [NO_BOX, REJECT, RIGHT])
    assert f"Proposed answer: {NO_BOX}" in user_text(t.asked[1])


def test_prompts_are_chat_messages_ending_with_the_request() -> None:
    turn = next(make().run(PROBLEM))
    assert turn.messages[0]["role"] == "system"
    assert turn.messages[-1]["role"] == "user"
    assert all(set(m) == {"role", "content"} for m in turn.messages)


def test_verifier_parse_tolerates_case_and_spaces_and_takes_the_last_tag() -> None:
    verifier = VerifierAgent()
    assert verifier.parse("<verify>approve</verify>") == "approve"
    assert verifier.parse("ok < Verify >REJECT< /verify >") == "reject"
    assert verifier.parse("<verify>reject</verify> no wait <verify>approve</verify>") == "approve"
    assert verifier.parse("<verify>maybe</verify>") is None
    assert verifier.parse("approve") is None


def test_solver_validity_needs_a_non_empty_box() -> None:
    solver = SolverAgent()
    assert solver.parse("so \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert not solver.is_valid("the answer is 12")
    assert not solver.is_valid("\\boxed{}")


def test_team_context_returns_latest_per_role() -> None:
    context = TeamContext()
    assert context.latest("solver") is None
    context.add("solver", "a")
    context.add("verifier", "b")
    context.add("solver", "c")
    assert context.latest("solver") == "c" and context.latest("verifier") == "b"


# --- construction and registries ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["solver", "verifier"])
def test_missing_role_is_named(missing: str) -> None:
    roles = {role: name for role, name in ROLES.items() if role != missing}
    with pytest.raises(ValueError, match=missing):
        MathOrchestra(MathSettings(), roles, SubstringTask())


def test_bad_malformed_verdict_names_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"system\.malformed_verdict"):
        make(malformed_verdict="ignore")


def test_bad_max_rounds_names_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"system\.max_rounds"):
        make(max_rounds=0)


def test_registries_find_orchestra_and_roles_by_name() -> None:
    assert ORCHESTRAS.get("math") is MathOrchestra
    assert AGENT_ROLES.get("solver") is SolverAgent
    assert AGENT_ROLES.get("verifier") is VerifierAgent
    assert make().agents == ("alice", "bob")


@AGENT_ROLES.register("test_terse_verifier")
class TerseVerifier(VerifierAgent):
    """A plugin's verifier: other words to the model, and a verdict read as yes / no."""

    def system_prompt(self) -> str:
        return "Reply yes or no."

    def parse(self, text: str):
        return {"yes": "approve", "no": "reject"}.get(text.strip().lower())


def test_a_registered_role_agent_gives_the_verifier_its_prompts_and_parsing() -> None:
    cfg = MathSettings(max_rounds=2, verifier_prompts="test_terse_verifier")
    transcript = drive(MathOrchestra(cfg, ROLES, SubstringTask()), [WRONG, "no", RIGHT])
    assert transcript.agents_asked() == ["alice", "bob", "alice"]  # "no" rejected: a second round
    assert transcript.asked[1].messages[0]["content"] == "Reply yes or no."
    assert transcript.asked[0].messages[0]["content"] == SolverAgent().system_prompt()  # the solver's are built-in
    assert transcript.outcome.reward == 1.0


def test_an_unknown_prompts_role_names_the_config_key() -> None:
    with pytest.raises(ValueError, match=r"system\.solver_prompts: 'solvr' is not a registered .*did you mean 'solver'"):
        MathOrchestra(MathSettings(solver_prompts="solvr"), ROLES, SubstringTask())
