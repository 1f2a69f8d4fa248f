"""The `debate` system: two solvers answer, read each other's answer and answer again; a judge picks one (a plugin;
imports `drmas.api` only).

Episode, on any math task (the built-in `arithmetic`, or `math_file` for GSM8K / MATH-style files):

1. round 1: each solver answers the question, ending with \\boxed{};
2. rounds 2..`system.rounds`: each solver is shown its own last reply and the other's, and answers again;
3. the judge is shown both final replies and picks one: <verify>approve</verify> takes Solver 1's answer (it
   checks Solver 1's answer against Solver 2's), <verify>reject</verify> takes Solver 2's. A reply without a
   verdict picks nothing (an invalid turn: the format penalty).

Rewards differ per agent (`EpisodeOutcome.agent_rewards`): each solver gets the task's grade of its own final
reply; the judge gets the grade of the reply it picked (1 for picking a correct answer, 0 for a wrong one or
none). The episode's reward (held-out accuracy, `drmas eval`) is the judge's: the system's answer is its pick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from drmas.api import (
    ORCHESTRAS,
    AgentTurn,
    EpisodeGenerator,
    EpisodeOutcome,
    Problem,
    RoleAgent,
    SystemSettings,
    Task,
    TeamContext,
    TurnResult,
    answers_match,
    extract_boxed,
    extract_last_number,
    help_field,
)

SOLVERS = ("solver_1", "solver_2")
_VERDICT = re.compile(r"<\s*verify\s*>\s*(approve|reject)\s*<\s*/\s*verify\s*>", re.IGNORECASE)
JUDGE = "judge"
_DEMO = "Sam has 3 pens and gets 4 more. How many pens does Sam have now?"


@dataclass
class DebateSettings(SystemSettings):
    name: str = SystemSettings.name_field("debate")
    rounds: int = help_field(
        2, "Answer rounds of the solvers: 1 = independent answers only; each further round shows every solver its "
        "last reply and the other's and asks again.")
    reply_chars: int = help_field(
        400, "Characters of a reply shown to the other solver and to the judge (the end of the reply, where the "
        "answer is).")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, rounds=1, reply_chars=20)


def answer_of(text: str) -> Optional[str]:
    """A reply's answer: its last \\boxed{}, else its last number."""
    return extract_boxed(text) or extract_last_number(text)


class DebateSolver(RoleAgent):
    """Answers with \\boxed{}; from round 2 on, after reading its own last reply and the other solver's (the end of
    each, `system.reply_chars`: the role reads the system's settings)."""

    other: str

    def system_prompt(self) -> str:
        return "You solve math problems. Write one short line of working, then the final number in \\boxed{}."

    def demonstrations(self) -> list[tuple[str, str]]:
        return [(_DEMO, "3 + 4 = 7. The answer is \\boxed{7}.")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        mine, theirs = context.latest(self.role), context.latest(self.other)
        if mine is None:
            return problem.question
        chars = self.settings.reply_chars
        return (f"{problem.question}\n\nYour answer:\n{_tail(mine, chars)}\n\nAnother solver's answer:\n"
                f"{_tail(theirs or '', chars)}\n\nCheck both, then give your final number in \\boxed{{}}.")

    def parse(self, text: str) -> Optional[str]:
        return extract_boxed(text)


class SolverOne(DebateSolver):
    role, other = SOLVERS


class SolverTwo(DebateSolver):
    role, other = SOLVERS[1], SOLVERS[0]


class Judge(RoleAgent):
    """Reads both solvers' final replies and picks one: <verify>approve</verify> takes Solver 1's answer,
    <verify>reject</verify> Solver 2's."""

    role = JUDGE
    stop = ("</verify>",)  # nothing after the verdict is needed

    def system_prompt(self) -> str:
        return ("Two solvers answered a math problem. Check Solver 1's answer. Write <verify>approve</verify> if it "
                "is right, or <verify>reject</verify> if it is wrong and Solver 2's answer should be taken.")

    def demonstrations(self) -> list[tuple[str, str]]:
        return [(self._request(_DEMO, "3 + 4 = 8. The answer is \\boxed{8}.", "3 + 4 = 7. The answer is \\boxed{7}."),
                 "3 + 4 = 7, so Solver 1 is wrong. <verify>reject</verify>"),
                (self._request(_DEMO, "3 + 4 = 7. The answer is \\boxed{7}.", "3 + 4 = 6. The answer is \\boxed{6}."),
                 "3 + 4 = 7, so Solver 1 is right. <verify>approve</verify>")]

    def _request(self, question: str, first: str, second: str) -> str:
        chars = self.settings.reply_chars
        return (f"{question}\n\nSolver 1:\n{_tail(first, chars)}\n\nSolver 2:\n{_tail(second, chars)}\n\n"
                "Is Solver 1 right?")

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        return self._request(problem.question, *(context.latest(solver) or "" for solver in SOLVERS))

    def parse(self, text: str) -> Optional[str]:
        """The solver picked (solver_1 for approve, solver_2 for reject), None without a verdict."""
        found = _VERDICT.findall(text)
        return None if not found else SOLVERS[0] if found[-1].lower() == "approve" else SOLVERS[1]


def _tail(text: str, chars: int) -> str:
    text = text.strip()
    return text if len(text) <= chars else "..." + text[-chars:]


@ORCHESTRAS.register("debate", settings=DebateSettings)
class Debate:
    # the system's own roles: `agents.<name>.role` names them; they need no global registration (nor a prefix)
    system_roles = {SOLVERS[0]: SolverOne, SOLVERS[1]: SolverTwo, JUDGE: Judge}

    def __init__(self, settings: DebateSettings, agents_by_role: Mapping[str, str], task: Task) -> None:
        missing = [role for role in (*SOLVERS, JUDGE) if role not in agents_by_role]
        if missing:
            raise ValueError(f"system debate needs agents with roles {', '.join(missing)} (agents.<name>.role)")
        self.settings, self.task = settings, task
        self.names = {role: agents_by_role[role] for role in (*SOLVERS, JUDGE)}
        self.agents = tuple(self.names.values())
        self.services: dict = {}
        self.roles = {role: cls(settings) for role, cls in self.system_roles.items()}

    def run(self, problem: Problem) -> EpisodeGenerator:
        context, turns = TeamContext(), []
        replies: dict[str, str] = {}
        for _ in range(self.settings.rounds):
            # both solvers see the same earlier round: record the round's replies only after both answered
            for role in SOLVERS:
                replies[role] = yield from self._turn(role, problem, context, turns)
            for role in SOLVERS:
                context.add(role, replies[role])
        verdict = yield from self._turn(JUDGE, problem, context, turns)
        picked = self.roles[JUDGE].parse(verdict)  # None: no verdict (an invalid turn), no answer
        grades = {role: float(self.task.grade(problem, replies[role])) for role in SOLVERS}
        reward = grades[picked] if picked is not None else 0.0
        answers = {role: answer_of(replies[role]) for role in SOLVERS}
        return EpisodeOutcome(
            reward=reward,  # the system's answer is the judge's pick
            turns=turns,
            final_answer=(answers[picked] or "") if picked is not None else "",
            agent_rewards={**{self.names[role]: grades[role] for role in SOLVERS}, self.names[JUDGE]: reward},
            info={"solvers_agree": float(_same(*answers.values())), "judge_approved": float(picked == SOLVERS[0]),
                  "best_solver": max(grades.values())},
        )

    def _turn(self, role: str, problem: Problem, context: TeamContext, turns: list[TurnResult]):
        agent, name = self.roles[role], self.names[role]
        text = yield AgentTurn(name, agent.messages(problem, context))
        turns.append(TurnResult(name, text, agent.is_valid(text)))
        return text


def _same(a: Optional[str], b: Optional[str]) -> bool:
    return a is not None and b is not None and answers_match(a, b)
