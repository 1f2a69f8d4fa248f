"""Role agents: what one role of a multi-agent system asks its LLM and how it reads the reply.

A role agent is pure text logic. It turns a problem plus the shared team context into chat messages, and
it judges/parses the response. It knows nothing of engines or of which model serves it, so the same role
can be played by differently configured agents (and models), and orchestras stay short: they only decide
*who* speaks *when*.

The prompts target very small instruct models (SmolLM2-135M-Instruct) with responses capped at roughly
64-128 tokens: they are short, say exactly which closing format is expected, and show it literally, because
a tiny model copies a concrete pattern far more reliably than it follows an abstract instruction.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Optional

from drmas.config.sections import SystemSettings
from drmas.config.systems import VERDICTS
from drmas.core.registry import Registry
from drmas.mas.base import AgentTurn
from drmas.tasks.base import Problem
from drmas.tasks.grading import extract_boxed

APPROVE, REJECT = VERDICTS

# Tolerates spaces inside the tags and any letter case, since small models drift on both.
_VERDICT_RE = re.compile(r"<\s*verify\s*>\s*(approve|reject)\s*<\s*/\s*verify\s*>", re.IGNORECASE)


@dataclass
class TeamContext:
    """What the agents of one episode have said so far, in order, keyed by role.

    Agents communicate only through this record (not through each other's chat histories), so each prompt
    can pick exactly the pieces its role needs and stays short for a small model's context.
    """

    entries: list[tuple[str, str]] = field(default_factory=list)  # (role, response text)

    def add(self, role: str, text: str) -> None:
        """Record that `role` said `text` (called by the orchestra after each answered turn)."""
        self.entries.append((role, text))

    def latest(self, role: str) -> Optional[str]:
        """The most recent response of `role`, or None when that role has not spoken yet."""
        for entry_role, text in reversed(self.entries):
            if entry_role == role:
                return text
        return None


class RoleAgent(ABC):
    """Prompting and output checking of one role; subclasses register themselves in AGENT_ROLES (or are a system's
    own: its factory's `system_roles`).

    A role is built as ``cls(settings)``, with the filled `system` section (an instance of the system's settings
    class; None where a role is used outside a system), kept as `self.settings`: a prompt can follow a setting. A
    subclass that needs its own constructor takes the same argument and calls ``super().__init__(settings)``."""

    role: ClassVar[str]
    # Generation stops once the reply holds one of these (kept in the reply): a role whose output ends in a
    # closing tag gains nothing from tokens after it, and a tiny model's trailing chatter only costs time.
    # An agent's own `agents.<name>.stop` strings are added to them.
    stop: ClassVar[tuple[str, ...]] = ()
    scripted: ClassVar[bool] = False  # True: turns computed by `respond`, not generated (see ScriptedRole)

    def __init__(self, settings: Optional[SystemSettings] = None) -> None:
        self.settings = settings

    def messages(self, problem: Problem, context: TeamContext) -> list[dict]:
        """Chat messages for this role's next call: system message, worked examples, then the request.

        The examples are given as real user/assistant exchanges because a tiny model imitates concrete
        previous replies much more reliably than it follows a described format.
        """
        messages = [{"role": "system", "content": self.system_prompt()}]
        for request, reply in self.demonstrations():
            messages.append({"role": "user", "content": request})
            messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": self.user_prompt(problem, context)})
        return messages

    @abstractmethod
    def demonstrations(self) -> list[tuple[str, str]]:
        """(request, ideal reply) pairs showing the required output format on unrelated problems."""

    @abstractmethod
    def system_prompt(self) -> str:
        """The role's standing instruction."""

    @abstractmethod
    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        """The request for this call, built from the problem and what the team has said so far."""

    def is_valid(self, text: str) -> bool:
        """Whether `text` has the output format this role requires (drives the format penalty)."""
        return self.parse(text) is not None

    @abstractmethod
    def parse(self, text: str) -> Optional[str]:
        """The role's structured output extracted from `text`, or None when the format is missing."""


class ScriptedRole(RoleAgent):
    """A role whose turns are computed by code, not generated by an LLM: an environment, a referee, a fixed
    opponent. The orchestra yields its turns like any other (`AgentTurn`, with whatever it needs in `state`);
    the episode driver answers them with `respond`, in the episode's own step. Its agent has no model
    (`agents.<name>: {role: <this role>}`), makes no sample and gets no reward; its turns still appear in
    `EpisodeOutcome.turns`. Expensive work shared by many episodes belongs in a `Service` (batched) instead.

    The prompt-building parts of `RoleAgent` have neutral defaults here: an orchestra may build a scripted
    role's messages like an LLM role's (so the config can swap either in) or pass `state` only."""

    scripted = True

    @abstractmethod
    def respond(self, turn: AgentTurn) -> str:
        """The reply to `turn` (its messages, and the orchestra's `state`)."""

    def demonstrations(self) -> list[tuple[str, str]]:
        return []

    def system_prompt(self) -> str:
        return ""

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        return problem.question

    def parse(self, text: str) -> Optional[str]:
        return text


AGENT_ROLES: Registry[type[RoleAgent]] = Registry("agent role")

# Worked examples for the demonstrations: unrelated to any task instance, one addition and one subtraction.
_DEMO_ADD = Problem("demo-add", "Sam has 3 pens and gets 4 more. How many pens does Sam have now?", "7")
_DEMO_SUB = Problem("demo-sub", "Lily has 9 cups and breaks 2. How many cups does Lily have left?", "7")


@AGENT_ROLES.register("solver")
class SolverAgent(RoleAgent):
    """Solves the problem and ends with a \\boxed{} answer; in later rounds it revises using feedback."""

    role = "solver"

    def system_prompt(self) -> str:
        return "You are a math solver. Write one short line of working, then the final number in \\boxed{}."

    def demonstrations(self) -> list[tuple[str, str]]:
        empty = TeamContext()
        return [
            (self.user_prompt(_DEMO_ADD, empty), "3 + 4 = 7. The answer is \\boxed{7}."),
            (self.user_prompt(_DEMO_SUB, empty), "9 - 2 = 7. The answer is \\boxed{7}."),
        ]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        previous = context.latest("solver")
        feedback = context.latest("verifier")
        if previous is None:
            return problem.question
        # A revision round: show what was answered and why it was questioned, so the solver can correct it.
        return (
            f"{problem.question}\n\n"
            f"Your previous answer:\n{previous.strip()}\n\n"
            f"A checker said:\n{(feedback or '').strip()}\n\n"
            "Solve it again and put the final number in \\boxed{}."
        )

    def parse(self, text: str) -> Optional[str]:
        """The content of the last \\boxed{}; None when absent, empty or cut off (no usable answer)."""
        return extract_boxed(text)


@AGENT_ROLES.register("verifier")
class VerifierAgent(RoleAgent):
    """Checks the solver's latest answer and decides with <verify>approve</verify> or <verify>reject</verify>."""

    role = "verifier"
    stop = ("</verify>",)

    def system_prompt(self) -> str:
        return (
            "You check answers to math questions. Redo the calculation in one line, then write "
            "<verify>approve</verify> if the answer is right or <verify>reject</verify> if it is wrong."
        )

    def demonstrations(self) -> list[tuple[str, str]]:
        # One approval and one rejection, so neither verdict is the only pattern to copy.
        return [
            (
                self._review_request(_DEMO_SUB, "9 - 2 = 7. The answer is \\boxed{7}."),
                "9 - 2 = 7, so 7 is right. <verify>approve</verify>",
            ),
            (
                self._review_request(_DEMO_ADD, "3 + 4 = 8. The answer is \\boxed{8}."),
                "3 + 4 = 7, so 8 is wrong. <verify>reject</verify>",
            ),
        ]

    def _review_request(self, problem: Problem, answer: str) -> str:
        """The user message of a demonstration: `problem` with `answer` as the solver's proposal."""
        context = TeamContext()
        context.add("solver", answer)
        return self.user_prompt(problem, context)

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        return f"Question: {problem.question}\nProposed answer: {proposed_answer(context.latest('solver') or '')}"

    def parse(self, text: str) -> Optional[str]:
        """The verdict ("approve" or "reject"), or None when no verdict tag is present.

        When several tags appear the last one wins: it is the verifier's conclusion after its reasoning.
        """
        found = _VERDICT_RE.findall(text)
        return found[-1].lower() if found else None


def proposed_answer(solver_text: str) -> str:
    """What the verifier is shown of a solver response: its boxed answer, or the whole text if unboxed.

    Showing only the final answer keeps the verifier's prompt short and stops a small model from copying
    the solver's ``\\boxed{}`` ending instead of giving a verdict (measured on SmolLM2-135M); the verifier
    is meant to recompute the result itself anyway. An unboxed response is shown whole so it can be judged.
    """
    return extract_boxed(solver_text) or solver_text.strip()
