"""The Revise system: a solver answers, a checker grades the answer, and only a wrong answer goes to a reviser.

Why it exists: Dr. MAS matters when the agents' reward distributions differ, and the most common way they
differ in practice is an agent that is *called only in some episodes*, conditioned on how the episode
went (a repair agent after failing tests, a second attempt after a rejection). Here the reviser is called
exactly in the episodes whose first answer was wrong, so its calls see a different reward distribution
than the solver's by construction, whatever the models' skill (the math system's verifier does not give
this with small models: an untrained verifier's verdict is unrelated to correctness, so every agent sees
about the same rewards). It is the setting of `bench/stability.py`.

The checker is the task's own grader (like unit tests for code), not an LLM: it yields no training sample
and cannot be wrong, so the conditioning is exact. Its feedback is only "wrong", never the gold answer.
Episode: the solver answers; while the answer is wrong and attempts remain (`system.max_rounds` attempts in
all: 1 solver call + up to max_rounds - 1 reviser calls), the reviser answers again, seeing the question,
the previous answer and the checker's verdict. The reward is the grade of the last answer, shared by every
call of the episode (minus each call's format penalty, as in every system). Held-out accuracy therefore
means "solved within max_rounds checked attempts".
"""

from __future__ import annotations

from typing import Generator, Mapping, Optional

from drmas.config.systems import ReviseSettings
from drmas.mas import ORCHESTRAS
from drmas.mas.agents import _DEMO_ADD, _DEMO_SUB, AGENT_ROLES, SolverAgent, TeamContext
from drmas.mas.base import AgentTurn, EpisodeGenerator, EpisodeOutcome, TurnResult
from drmas.tasks.base import Problem, Task
from drmas.tasks.grading import extract_boxed

SOLVER = "solver"
REVISER = "reviser"
CHECKER = "checker"
ROLES = (SOLVER, REVISER)


def checker_feedback(answer_text: str) -> str:
    """What the checker tells the reviser about a wrong answer: that it is wrong, never the right one."""
    shown = extract_boxed(answer_text) or answer_text.strip() or "(no answer)"
    return f"The answer {shown} is wrong."


@AGENT_ROLES.register(REVISER)
class ReviserAgent(SolverAgent):
    """Answers again after the checker rejected the previous answer; same output format as the solver."""

    role = REVISER

    def system_prompt(self) -> str:
        return ("You are a math reviser. A previous answer was checked and is wrong. Write one short line of "
                "working, then the correct final number in \\boxed{}.")

    def demonstrations(self) -> list[tuple[str, str]]:
        return [
            (self._request(_DEMO_ADD, "3 + 4 = 8. The answer is \\boxed{8}."), "3 + 4 = 7. The answer is \\boxed{7}."),
            (self._request(_DEMO_SUB, "9 - 2 = 6. The answer is \\boxed{6}."), "9 - 2 = 7. The answer is \\boxed{7}."),
        ]

    def _request(self, problem: Problem, wrong: str) -> str:
        context = TeamContext()
        context.add(SOLVER, wrong)
        context.add(CHECKER, checker_feedback(wrong))
        return self.user_prompt(problem, context)

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        previous = _latest_answer(context) or ""
        return (
            f"{problem.question}\n\n"
            f"Previous answer:\n{previous.strip()}\n\n"
            f"Checker: {context.latest(CHECKER) or ''}\n\n"
            "Solve it again and put the final number in \\boxed{}."
        )


def _latest_answer(context: TeamContext) -> Optional[str]:
    """The newest answer of the team, whoever gave it (solver first, then the reviser's attempts)."""
    for role, text in reversed(context.entries):
        if role in ROLES:
            return text
    return None


@ORCHESTRAS.register("math_revise", settings=ReviseSettings)
class ReviseOrchestra:
    """Solver, task-graded check, reviser on a wrong answer (see the module docstring)."""

    def __init__(self, system_cfg: ReviseSettings, agents_by_role: Mapping[str, str], task: Task) -> None:
        for role in ROLES:
            if not agents_by_role.get(role):
                known = ", ".join(f"{r}={n}" for r, n in agents_by_role.items()) or "none"
                raise ValueError(f"the math_revise system needs an agent with role {role!r}; configured roles: {known}")
        system_cfg.validate("system")
        self.max_attempts: int = system_cfg.max_rounds
        self.task = task
        self.solver_name: str = agents_by_role[SOLVER]
        self.reviser_name: str = agents_by_role[REVISER]
        self.agents: tuple[str, ...] = (self.solver_name, self.reviser_name)
        self.services: dict = {}  # the checker is the task's grader, called in-process
        self.solver = AGENT_ROLES.get(SOLVER)(system_cfg)
        self.reviser = AGENT_ROLES.get(REVISER)(system_cfg)

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Solver, then reviser attempts while the checker says wrong and attempts remain."""
        context, turns = TeamContext(), []
        text = yield from self._call(self.solver, self.solver_name, problem, context, turns)
        reward = float(self.task.grade(problem, text))
        attempts = 1
        while reward < 1.0 and attempts < self.max_attempts:
            context.add(CHECKER, checker_feedback(text))
            text = yield from self._call(self.reviser, self.reviser_name, problem, context, turns)
            reward = float(self.task.grade(problem, text))
            attempts += 1
        return EpisodeOutcome(
            reward=reward, turns=turns, final_answer=self.solver.parse(text) or "",
            info={"attempts": attempts, "revised": attempts > 1, "first_correct": attempts == 1 and reward >= 1.0},
        )

    @staticmethod
    def _call(agent, name: str, problem: Problem, context: TeamContext,
              turns: list[TurnResult]) -> Generator[AgentTurn, str, str]:
        text = yield AgentTurn(agent=name, messages=agent.messages(problem, context))
        text = text if text is not None else ""
        turns.append(TurnResult(agent=name, text=text, valid=agent.is_valid(text)))
        context.add(agent.role, text)
        return text
