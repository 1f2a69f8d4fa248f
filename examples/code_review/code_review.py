"""The `code_review` system: a coder writes a Python function, a tester writes asserts for it, the sandbox runs
them (a plugin; imports `drmas.api` only).

Episode, on a task of `code_tasks` (or any task whose problems carry meta entry_point, reference, wrong, tests):

1. the coder answers the prompt (a signature and docstring) with the function in a ```python block;
2. the tester, shown the prompt and the coder's code, answers with assert statements;
3. one sandbox round (all episodes' programs in one batch on the sandbox's workers) runs: the coder's code
   against the task's hidden tests; the tester's asserts against the reference solution, against the task's
   wrong solution and against the coder's code;
4. with `system.revisions` > 0, a coder whose code fails some of the tester's asserts is shown those failures
   and writes the function again, and the checks of its new code run again.

Rewards differ per agent (`EpisodeOutcome.agent_rewards`): the coder gets the share of hidden tests its last
code passes (`system.coder_reward: fraction`) or 1/0 for all of them (`all`); the tester gets 1 when every one
of its asserts passes on the reference and at least one fails on the wrong solution (sound and catching the
bug), `system.sound_reward` when they pass on the reference but catch nothing, else 0. The episode's reward
(held-out accuracy, `drmas eval`) is 1 when the coder's last code passes every hidden test.

A reply without code, or code that does not parse or define the task's function, is an invalid turn (the
format penalty); it is still run against the hidden tests (the sandbox reports the SyntaxError), so every
episode's checks go through the sandbox, whatever the model writes.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from drmas.api import (
    AGENT_ROLES,
    ORCHESTRAS,
    AgentTurn,
    AssertReport,
    AssertRequest,
    AssertService,
    EpisodeGenerator,
    EpisodeOutcome,
    Problem,
    RoleAgent,
    SandboxConfig,
    SandboxService,
    ServiceCall,
    SystemSettings,
    Task,
    TeamContext,
    TurnResult,
    help_field,
)

CODER, TESTER = "coder", "tester"
COVERAGE = ("fraction", "all")
# the tester's request ends by naming the function: untrained SmolLM2-135M, asked without it, repeated the coder's
# code on all 9 held-out tasks; with it, 4 of 9 replies held asserts (README, "What models make of it")
_ASK = "Write assert statements that call {name} on a few inputs and check its results; do not rewrite {name}."
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


@dataclass
class CodeReviewSettings(SystemSettings):
    name: str = SystemSettings.name_field("code_review")
    revisions: int = help_field(
        0, "Times a coder whose code fails some of the tester's asserts is shown the failures and writes it again.")
    coder_reward: str = help_field(
        "fraction", "Coder reward: 'fraction' (share of the hidden tests its last code passes) or 'all' (1 when it "
        "passes every one, else 0). Held-out accuracy is always 'all'.")
    sound_reward: float = help_field(
        0.2, "Tester reward when every assert passes on the reference but none fails on the wrong solution (1 when "
        "one also fails there; 0 when any fails on the reference, or there is none).")
    max_asserts: int = help_field(8, "Asserts of a tester reply that are run (the first N; the rest are ignored).")
    per_test_timeout_s: float = help_field(
        2.0, "Wall-clock limit of one test (a hidden test or one of the tester's asserts): a test over it fails alone.")
    feedback_chars: int = help_field(600, "Characters of the failed asserts shown to a revising coder.")
    sandbox: SandboxConfig = help_field(
        SandboxConfig, "The sandbox that runs the code (docs/sandbox.md): its workers run the checks of all episodes "
        "waiting in one round in parallel.")

    def problems(self, where: str) -> list[str]:
        found = self.at_least(where, revisions=0, sound_reward=0.0, max_asserts=1, feedback_chars=0)
        if not self.per_test_timeout_s > 0:
            found.append(f"{where}.per_test_timeout_s: must be > 0, got {self.per_test_timeout_s}")
        return found + self.one_of(where, "coder_reward", COVERAGE)


def code_block(text: str) -> str:
    """The code of a reply: its last ```python block (an unclosed one runs to the end), else the whole reply."""
    blocks = _FENCE.findall(text)
    return (blocks[-1] if blocks else text).strip("\n")


def functions(code: str) -> list[str]:
    """The functions `code` defines at its top level ([] when it does not parse); read, never run."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return []
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef)]


def assert_statements(code: str) -> list[str]:
    """The assert statements of a tester reply, each as source: from the whole block when it parses, else from
    the lines that parse alone (a tiny model's reply is rarely all valid)."""
    try:
        nodes = ast.parse(code).body
    except (SyntaxError, ValueError):
        nodes = []
        for line in code.splitlines():
            try:
                nodes += ast.parse(line.strip()).body
            except (SyntaxError, ValueError):
                continue
    return [ast.unparse(node) for node in nodes if isinstance(node, ast.Assert)]


@AGENT_ROLES.register(CODER)
class Coder(RoleAgent):
    """Writes the function of the prompt; in a revision, again after the tester's failed asserts."""

    role = CODER

    def system_prompt(self) -> str:
        return "You write Python functions. Reply with the complete function in a ```python code block."

    def demonstrations(self) -> list[tuple[str, str]]:
        return [('def double(x: int) -> int:\n    """Return x times two.\n\n    Example: double(4) == 8\n    """\n',
                 "```python\ndef double(x: int) -> int:\n    return x * 2\n```")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        failures = context.latest("sandbox")
        if failures is None:
            return problem.question
        return (f"{problem.question}\nYour code:\n```python\n{code_block(context.latest(CODER) or '')}\n```\n"
                f"These tests failed:\n{failures}\nWrite the function again.")

    def parse(self, text: str) -> Optional[str]:
        """The code, when it parses and defines a function (the orchestra also checks it is the task's)."""
        code = code_block(text)
        return code if functions(code) else None


@AGENT_ROLES.register(TESTER)
class Tester(RoleAgent):
    """Writes assert statements that check the function of the prompt (shown the coder's code)."""

    role = TESTER

    def system_prompt(self) -> str:
        return ("You test Python functions. Reply with a few assert statements that a correct function passes, one "
                "per line, in a ```python code block.")

    def demonstrations(self) -> list[tuple[str, str]]:
        return [('def double(x: int) -> int:\n    """Return x times two."""\n\nCode to test:\n```python\n'
                 'def double(x: int) -> int:\n    return x + 2\n```\n' + _ASK.format(name="double"),
                 "```python\nassert double(0) == 0\nassert double(3) == 6\nassert double(-2) == -4\n```")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        return (f"{problem.question}\nCode to test:\n```python\n{code_block(context.latest(CODER) or '')}\n```\n"
                + _ASK.format(name=problem.meta["entry_point"]))

    def parse(self, text: str) -> Optional[str]:
        asserts = assert_statements(code_block(text))
        return "\n".join(asserts) if asserts else None


class Checks:
    """The episodes' service: a batch of check lists (one per waiting episode, each a tuple of AssertRequests) ->
    their reports, all run in one AssertService batch so the sandbox's workers take every episode's programs
    together."""

    def __init__(self, sandbox: SandboxService) -> None:
        self.asserts = AssertService(sandbox)

    def call_batch(self, requests: Sequence[tuple[AssertRequest, ...]]) -> list[list[AssertReport]]:
        reports = iter(self.asserts.call_batch([check for checks in requests for check in checks]))
        return [[next(reports) for _ in checks] for checks in requests]


@ORCHESTRAS.register("code_review", settings=CodeReviewSettings)
class CodeReview:
    def __init__(self, settings: CodeReviewSettings, agents_by_role: Mapping[str, str], task: Task) -> None:
        missing = [role for role in (CODER, TESTER) if role not in agents_by_role]
        if missing:
            raise ValueError(f"system code_review needs agents with roles {', '.join(missing)} (agents.<name>.role)")
        self.settings = settings  # the task is used through its problems' meta (tests, reference, wrong)
        self.names = {role: agents_by_role[role] for role in (CODER, TESTER)}
        self.agents = tuple(self.names.values())
        self.roles = {CODER: Coder(settings), TESTER: Tester(settings)}
        self.sandbox = SandboxService(settings.sandbox, where="system.sandbox")
        self.services = {"checks": Checks(self.sandbox)}

    def close(self) -> None:
        """Called by drmas when it is done with the orchestra: the sandbox's running programs and workers go."""
        self.sandbox.close()

    def run(self, problem: Problem) -> EpisodeGenerator:
        meta, context, turns = problem.meta, TeamContext(), []
        code = yield from self._code(problem, context, turns)
        tester_reply = yield from self._turn(TESTER, problem, context, turns)
        asserts = tuple(assert_statements(code_block(tester_reply))[: self.settings.max_asserts])
        # one sandbox round: the hidden tests on the code; the asserts on the reference and the wrong solution
        # (and on the code, when a failure there would send it back to the coder)
        revise = bool(asserts) and self.settings.revisions > 0
        checks = (self._check(code, meta["tests"]),
                  *((self._check(meta["reference"], asserts), self._check(meta["wrong"], asserts)) if asserts else ()),
                  *((self._check(code, asserts),) if revise else ()))
        hidden_report, *on = yield ServiceCall("checks", checks)
        programs, revised = len(checks), 0
        while revise and not on[-1].all_passed and revised < self.settings.revisions:
            context.add("sandbox", _failures(asserts, on[-1], self.settings.feedback_chars))
            code = yield from self._code(problem, context, turns)
            hidden_report, on[-1] = yield ServiceCall("checks", (self._check(code, meta["tests"]),
                                                                 self._check(code, asserts)))
            programs, revised = programs + 2, revised + 1
        passed = hidden_report.n_passed / len(meta["tests"])
        sound = bool(asserts) and on[0].all_passed
        catches = sound and not on[1].all_passed
        coder = passed if self.settings.coder_reward == "fraction" else float(hidden_report.all_passed)
        tester = 1.0 if catches else self.settings.sound_reward if sound else 0.0
        return EpisodeOutcome(
            reward=float(hidden_report.all_passed),  # held-out accuracy: every hidden test passed
            turns=turns,
            final_answer=code if meta["entry_point"] in functions(code) else "",
            agent_rewards={self.names[CODER]: coder, self.names[TESTER]: tester},
            info={"hidden_passed": passed, "code_loads": float(not hidden_report.solution_error),
                  "asserts": len(asserts), "tester_sound": float(sound), "tester_catches": float(catches),
                  "revisions": revised, "programs": programs},
        )

    def _check(self, solution: str, tests: Sequence[str]) -> AssertRequest:
        return AssertRequest(solution, tuple(tests), self.settings.per_test_timeout_s)

    def _code(self, problem: Problem, context: TeamContext, turns: list[TurnResult]):
        """A coder turn: its code (the reply's block), valid when it defines the task's function."""
        text = yield AgentTurn(self.names[CODER], self.roles[CODER].messages(problem, context))
        code = code_block(text)
        turns.append(TurnResult(self.names[CODER], text, problem.meta["entry_point"] in functions(code)))
        context.add(CODER, text)
        return code

    def _turn(self, role: str, problem: Problem, context: TeamContext, turns: list[TurnResult]):
        agent, name = self.roles[role], self.names[role]
        text = yield AgentTurn(name, agent.messages(problem, context))
        turns.append(TurnResult(name, text, agent.is_valid(text)))
        context.add(role, text)
        return text


def _failures(asserts: Sequence[str], report: AssertReport, chars: int) -> str:
    """What a revising coder is shown: its load error, or each failed assert with its error."""
    if report.solution_error:
        text = f"the code did not load: {report.solution_error}"
    else:
        text = "\n".join(f"{test}  # {outcome.error}" for test, outcome in zip(asserts, report.outcomes)
                         if not outcome.passed)
    return text[:chars]
