"""The learning benchmark's `lookup` setting: a task and two role agents, a plugin written against `drmas.api` only.

Task `lookup`: "Mia has 7 apples, Ben has 12 apples and Ava has 3 apples. How many apples does Ben have?" The
answer is one of the question's numbers. SmolLM2-135M-Instruct half knows how to find it: greedy it is right
on about half of such questions and, sampled at temperature 0.8, on about a quarter of them (pilot P9 of
docs/learning.md). That is the range where a group of 8 holds right and wrong answers and RL has something to
learn from. The held-out problems differ from every training problem in people, numbers or the one asked.

System `lookup_credit` (bench/stability.py --setting lookup_credit, issue 34 part 2): one solver call, then one
verifier call, with rewards that differ in scale by construction. The solver gets the task's grade of its answer
(0 or 1); the verifier gets `verifier_scale` (0.1) when its verdict matches that answer's correctness, else 0. This
is setting (b) of bench/expected_advantages.py: global normalisation must mis-assign or mis-scale one of them.

Roles `lookup_solver` and `lookup_verifier` (chosen by `system.solver_prompts` / `system.verifier_prompts` of the
`math` system): the math system's solver and verifier with worked examples of this task. With the built-in
arithmetic examples SmolLM2 does arithmetic on these questions too ("Lena has 6 - 1 = 5 pencils") and is right
on 0.110 of them (P7).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from drmas.api import (
    AGENT_ROLES,
    ORCHESTRAS,
    TASKS,
    AgentTurn,
    EpisodeGenerator,
    EpisodeOutcome,
    Problem,
    SolverAgent,
    SystemSettings,
    Task,
    TaskSettings,
    TeamContext,
    TurnResult,
    VerifierAgent,
    grade_answer,
    help_field,
)

NAMES = ("Mia", "Liam", "Ava", "Noah", "Zoe", "Omar", "Ben", "Priya", "Lena", "Tom", "Ines", "Raj")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "stamps")


@dataclass
class LookupSettings(TaskSettings):
    """Recall one person's count from a list of counts."""

    name: str = TaskSettings.name_field("lookup")
    seed: int = help_field(0, "Seed of the generated task (same seed -> same problems).")
    n_train: int = help_field(2000, "Training problems.")
    n_test: int = help_field(200, "Held-out problems (each differs from every training one in people, numbers "
                             "or the one asked).")
    people: int = help_field(3, "People (and counts) per question.")
    max_value: int = help_field(30, "Counts are distinct numbers in 1..max_value.")

    def problems(self, where: str) -> list[str]:
        found = self.at_least(where, n_train=1, n_test=1, people=2)
        if not self.people <= min(len(NAMES), self.max_value):
            found.append(f"{where}.people: at most {min(len(NAMES), self.max_value)} (the names and the values "
                         f"1..max_value must be distinct), got {self.people}")
        return found


def draw_question(rng: random.Random, people: int, max_value: int) -> tuple[str, str, tuple]:
    """(question, answer, skeleton): the skeleton (names, counts, who is asked) is what makes two problems the same."""
    names = tuple(rng.sample(NAMES, people))
    values = tuple(rng.sample(range(1, max_value + 1), people))
    asked = rng.randrange(people)
    item = rng.choice(ITEMS)
    parts = [f"{n} has {v} {item}" for n, v in zip(names, values)]
    listing = ", ".join(parts[:-1]) + f" and {parts[-1]}"
    return f"{listing}. How many {item} does {names[asked]} have?", str(values[asked]), (names, values, asked)


class LookupTask:
    name = "lookup"

    def __init__(self, cfg: LookupSettings) -> None:
        rng = random.Random(cfg.seed)
        seen: set[tuple] = set()
        self._splits: dict[str, list[Problem]] = {}
        for split, size in (("test", cfg.n_test), ("train", cfg.n_train)):  # test first: it ignores n_train
            problems = []
            while len(problems) < size:
                question, answer, skeleton = draw_question(rng, cfg.people, cfg.max_value)
                if skeleton not in seen:
                    seen.add(skeleton)
                    problems.append(Problem(f"lookup-{split}-{len(problems):05d}", question, answer))
            self._splits[split] = problems

    def split(self, name: str) -> list[Problem]:
        return self._splits[name]

    def grade(self, problem: Problem, response: str) -> float:
        return grade_answer(response, problem.answer)


@TASKS.register("lookup", settings=LookupSettings)
def make_lookup_task(cfg: LookupSettings) -> LookupTask:
    return LookupTask(cfg)


_DEMO_1 = Problem("demo-1", "Sam has 3 pens, Ana has 8 pens and Leo has 5 pens. How many pens does Ana have?", "8")
_DEMO_2 = Problem("demo-2", "Kim has 12 cups, Raj has 4 cups and Eve has 9 cups. How many cups does Kim have?", "12")


@AGENT_ROLES.register("lookup_solver")
class LookupSolver(SolverAgent):
    """The built-in solver (its boxed-answer parsing) told about counts, with examples of this task."""

    def system_prompt(self) -> str:
        return "You answer questions about counts. Find the person asked about and give their number in \\boxed{}."

    def demonstrations(self) -> list[tuple[str, str]]:
        empty = TeamContext()
        return [(self.user_prompt(_DEMO_1, empty), "Ana has 8 pens. The answer is \\boxed{8}."),
                (self.user_prompt(_DEMO_2, empty), "Kim has 12 cups. The answer is \\boxed{12}.")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        previous = context.latest("solver")
        if previous is None:
            return problem.question
        return (f"{problem.question}\n\nYour previous answer:\n{previous.strip()}\n\nA checker said it is wrong. "
                "Find the person again and put their number in \\boxed{}.")


@AGENT_ROLES.register("lookup_verifier")
class LookupVerifier(VerifierAgent):
    """The built-in verifier (its request and verdict parsing) told about counts, with examples of this task."""

    def system_prompt(self) -> str:
        return ("You check answers to questions about counts. Say what the person asked about has, then write "
                "<verify>approve</verify> if the answer is right or <verify>reject</verify> if it is wrong.")

    def demonstrations(self) -> list[tuple[str, str]]:
        return [(self._review_request(_DEMO_1, "The answer is \\boxed{8}."),
                 "Ana has 8 pens, so 8 is right. <verify>approve</verify>"),
                (self._review_request(_DEMO_2, "The answer is \\boxed{4}."),
                 "Kim has 12 cups, so 4 is wrong. <verify>reject</verify>")]


@dataclass
class LookupCreditSettings(SystemSettings):
    """One solver call and one verifier call, each agent rewarded for its own work, on different scales."""

    name: str = SystemSettings.name_field("lookup_credit")
    verifier_scale: float = help_field(
        0.1, "The verifier's reward for a verdict that matches the answer's correctness (0 otherwise); the "
        "solver's is the task grade, 0 or 1.")

    def problems(self, where: str) -> list[str]:
        if not self.verifier_scale > 0:
            return [f"{where}.verifier_scale: must be > 0, got {self.verifier_scale}"]
        return []


@ORCHESTRAS.register("lookup_credit", settings=LookupCreditSettings)
class LookupCredit:
    """Roles `lookup_solver` and `lookup_verifier`. The solver answers, verifier judges that answer; the episode ends there (the verdict changes nothing but the
    verifier's own reward, so the two agents' rewards are as independent as the task allows)."""

    def __init__(self, settings: LookupCreditSettings, agents_by_role: dict[str, str], task: Task) -> None:
        missing = [r for r in ("lookup_solver", "lookup_verifier") if not agents_by_role.get(r)]
        if missing:
            raise ValueError(f"system lookup_credit needs agents with roles {', '.join(missing)} (agents.<name>.role)")
        self.settings, self.task = settings, task
        self.solver_name, self.verifier_name = agents_by_role["lookup_solver"], agents_by_role["lookup_verifier"]
        self.agents = (self.solver_name, self.verifier_name)
        self.services: dict = {}
        self.solver, self.verifier = LookupSolver(), LookupVerifier()

    def run(self, problem: Problem) -> EpisodeGenerator:
        context = TeamContext()
        answer = yield AgentTurn(self.solver_name, self.solver.messages(problem, context))
        context.add("solver", answer)
        verdict_text = yield AgentTurn(self.verifier_name, self.verifier.messages(problem, context))
        grade = float(self.task.grade(problem, answer))
        verdict = self.verifier.parse(verdict_text)  # None: no verdict, an invalid turn, never a right one
        right = verdict is not None and (verdict == "approve") == (grade >= 1.0)
        return EpisodeOutcome(
            reward=grade,
            turns=[TurnResult(self.solver_name, answer, self.solver.is_valid(answer)),
                   TurnResult(self.verifier_name, verdict_text, self.verifier.is_valid(verdict_text))],
            final_answer=self.solver.parse(answer) or "",
            agent_rewards={self.solver_name: grade, self.verifier_name: self.settings.verifier_scale * float(right)},
            info={"verdict_right": float(right), "approved": float(verdict == "approve")},
        )
