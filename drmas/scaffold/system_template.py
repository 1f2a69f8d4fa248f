"""template_system: a multi-agent system for drmas (a plugin written by `drmas new-system template_system`).

Train it: `drmas run --config template_system.yaml` (the config beside this file lists it under `plugins`).
Everything a plugin uses comes from `drmas.api`; docs/extending.md of drmas explains each piece.

The episode: a writer answers the problem with a number in \\boxed{}; a critic accepts or rejects it with
<verdict>accept</verdict> / <verdict>reject</verdict>; a rejected answer goes back to the writer, who sees the
critic's reply, for up to `system.rounds` rounds. Rewards differ per agent: the writer gets the task's grade
of its last answer, the critic `system.critic_reward` for a last verdict that agrees with that grade. A reply
without an answer earns 0 (and the format penalty), never more than a wrong one: a reward that paid for silence
would teach the model to stop answering.
Change the roles' prompts, the turn logic in `run` and the rewards to make it your system (drmas.api.testing plays
its episodes on replies you write, without a model: a quick test of each rule); register a
task of your own with `@TASKS.register(...)` or keep a built-in one (the config uses `arithmetic`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from drmas.api import (
    ORCHESTRAS,
    PRIMING_FORMATS,
    AgentTurn,
    EpisodeGenerator,
    EpisodeOutcome,
    Problem,
    RoleAgent,
    SystemSettings,
    Task,
    TeamContext,
    TurnResult,
    PrimingFormats,
    extract_boxed,
    help_field,
)

# role names (agents.<name>.role in the config): this system's own (`system_roles` below), so plain names are safe
WRITER, CRITIC = "writer", "critic"
_VERDICT = re.compile(r"<\s*verdict\s*>\s*(accept|reject)\s*<\s*/\s*verdict\s*>", re.IGNORECASE)


@dataclass
class TemplateSystemSettings(SystemSettings):
    """`system.*` of this system: typed, checked and listed by `drmas config keys` like every drmas setting."""

    name: str = SystemSettings.name_field("template_system")
    rounds: int = help_field(2, "Writer/critic rounds at most; a rejected answer is revised in the next round.")
    critic_reward: float = help_field(1.0, "Reward of a critic whose last verdict agrees with the task's grade.")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, rounds=1, critic_reward=0.0)


class Writer(RoleAgent):
    """Answers, or revises after the critic's reply, ending with \\boxed{}."""

    role = WRITER

    def system_prompt(self) -> str:
        return "Solve the problem. Write one short line of working, then the final number in \\boxed{}."

    def demonstrations(self) -> list[tuple[str, str]]:
        return [("Sam has 3 pens and gets 4 more. How many pens does Sam have now?", "3 + 4 = 7, so \\boxed{7}.")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        critique = context.latest(CRITIC)
        if critique is None:
            return problem.question
        return f"{problem.question}\n\nYour answer: {context.latest(WRITER)}\nA critic said: {critique}\nSolve it again."

    def parse(self, text: str) -> Optional[str]:
        return extract_boxed(text)


class Critic(RoleAgent):
    """Approves or rejects the writer's latest answer."""

    role = CRITIC
    stop = ("</verdict>",)  # nothing after the verdict is needed

    def system_prompt(self) -> str:
        return "Check the answer. Write <verdict>accept</verdict> if it is right or <verdict>reject</verdict> if not."

    def demonstrations(self) -> list[tuple[str, str]]:
        return [("Question: What is 3 + 4?\nAnswer: 8", "Not 8. <verdict>reject</verdict>")]

    def user_prompt(self, problem: Problem, context: TeamContext) -> str:
        answer = context.latest(WRITER) or ""
        return f"Question: {problem.question}\nAnswer: {extract_boxed(answer) or answer.strip()}"

    def parse(self, text: str) -> Optional[str]:
        found = _VERDICT.findall(text)
        return found[-1].lower() if found else None


# What the config's tiny test model is primed to write (models.policy.tiny.prime_system: template_system): after
# each role's own prompt, that role's formats with random numbers (never answers), so a new model writes them and
# rewards vary from step 1. Change these with the roles' formats; a real model needs none of it.
_ASKED = [Problem(f"priming-{i}", q, "") for i, q in enumerate(("What is 2 + 5?", "Tom has 4 cups and buys 3 more. "
                                                                 "How many cups does he have?", "What is 6 + 1?"))]
_ANSWERED = TeamContext()
_ANSWERED.add(WRITER, "2 + 5 = 6, so \\boxed{6}.")
PRIMING_FORMATS.register("template_system")(PrimingFormats(exchanges=(
    *((Writer().messages(q, TeamContext()), reply) for q in _ASKED
      for reply in ("{a} + {b} = {n}, so \\boxed{{{n}}}.", "The answer is \\boxed{{{n}}}.")),
    *((Critic().messages(q, _ANSWERED), reply) for q in _ASKED
      for reply in ("<verdict>accept</verdict>", "<verdict>reject</verdict>")),  # short: the critic writes <= 12 tokens
)))


@ORCHESTRAS.register("template_system", settings=TemplateSystemSettings)
class TemplateSystemOrchestra:
    """The turn logic: which agent speaks when (see the module docstring)."""

    system_roles = {WRITER: Writer, CRITIC: Critic}  # the roles agents.<name>.role can name here

    def __init__(self, settings: TemplateSystemSettings, agents_by_role: Mapping[str, str], task: Task) -> None:
        settings.validate("system")
        missing = [role for role in (WRITER, CRITIC) if role not in agents_by_role]
        if missing:
            raise ValueError(f"the template_system system needs agents with roles {missing} (agents.<name>.role)")
        self.settings, self.task = settings, task
        self.names = {role: agents_by_role[role] for role in (WRITER, CRITIC)}  # role -> agent name
        self.agents = tuple(self.names.values())
        self.services: dict = {}  # services the episodes call by name (objects with call_batch); none here
        self.roles = {role: cls(settings) for role, cls in self.system_roles.items()}  # a role sees the settings

    def run(self, problem: Problem) -> EpisodeGenerator:
        context, turns = TeamContext(), []
        answer, verdict = "", None
        for _ in range(self.settings.rounds):
            answer = yield from self._turn(WRITER, problem, context, turns)
            verdict = self.roles[CRITIC].parse((yield from self._turn(CRITIC, problem, context, turns)))
            if verdict == "accept":
                break
        grade = float(self.task.grade(problem, answer))
        # no verdict is neither approve nor reject: counting it as a reject would pay a silent critic
        critic_right = verdict is not None and (verdict == "accept") == (grade >= 1.0)
        return EpisodeOutcome(
            reward=grade,  # the episode's task reward: what held-out evaluation reports
            turns=turns,
            final_answer=self.roles[WRITER].parse(answer) or "",
            agent_rewards={self.names[WRITER]: grade,  # per-agent rewards (by agent name)
                           self.names[CRITIC]: self.settings.critic_reward if critic_right else 0.0},
            info={"accepted": verdict == "accept"},
        )

    def _turn(self, role: str, problem: Problem, context: TeamContext, turns: list[TurnResult]):
        """Ask the agent playing `role`; record whether its reply has the role's format (the format penalty)."""
        agent, name = self.roles[role], self.names[role]
        text = yield AgentTurn(name, agent.messages(problem, context))
        turns.append(TurnResult(name, text, agent.is_valid(text)))
        context.add(role, text)
        return text
