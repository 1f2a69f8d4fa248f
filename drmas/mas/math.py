"""The Math system: a solver and a verifier take turns for up to K rounds.

Round r (1..K): the solver answers (from round 2 on it sees its previous answer and the verifier's
feedback through the team context); in every round but the last the verifier reviews that answer.
`approve` ends the episode, `reject` starts the next round. The last round has no verifier because its
verdict could not change anything. The final solver response is graded by the task, and that reward is
shared by every call of the episode.

A verifier reply without a verdict tag is always an *invalid* turn (it draws the format penalty), but what
it *means* for the episode is a choice: the reference implementation treats it as approve, which quietly
rewards a verifier for skipping the format whenever the solver is right. `system.malformed_verdict` makes
that choice explicit ("approve" = reference behaviour, or "reject").

What the two agents are told (system prompt, worked examples, the request) and how their replies are read is
a `RoleAgent`'s: the built-in `solver` and `verifier` by default, or registered ones named by
`system.solver_prompts` / `system.verifier_prompts`, so a task gets worked examples of its own (a small model
copies its examples: arithmetic ones make it do arithmetic on any question) without a new system.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Mapping

from drmas.config.systems import MathSettings
from drmas.mas import ORCHESTRAS
from drmas.mas.agents import AGENT_ROLES, APPROVE, RoleAgent, TeamContext
from drmas.mas.base import AgentTurn, EpisodeGenerator, EpisodeOutcome, TurnResult
from drmas.tasks.base import Problem, Task

SOLVER = "solver"
VERIFIER = "verifier"
ROLES = (SOLVER, VERIFIER)


@dataclass
class _Episode:
    """Mutable bookkeeping of one running episode (kept apart so `run` reads as the turn logic only)."""

    context: TeamContext = field(default_factory=TeamContext)
    turns: list[TurnResult] = field(default_factory=list)
    verifier_calls: int = 0
    malformed_verdicts: int = 0


@ORCHESTRAS.register("math", settings=MathSettings)
class MathOrchestra:
    """Solver/verifier loop of the Math workflow (see the module docstring for the episode rules)."""

    def __init__(self, system_cfg: MathSettings, agents_by_role: Mapping[str, str], task: Task) -> None:
        _check_roles(agents_by_role)
        system_cfg.validate("system")
        self.max_rounds: int = system_cfg.max_rounds
        self.malformed_verdict: str = system_cfg.malformed_verdict
        self.task = task
        self.solver_name: str = agents_by_role[SOLVER]
        self.verifier_name: str = agents_by_role[VERIFIER]
        self.agents: tuple[str, ...] = (self.solver_name, self.verifier_name)
        self.services: dict = {}  # the math system calls no services
        # the agents' positions are solver and verifier; what they are told can be a plugin's (system.*_prompts)
        solver = AGENT_ROLES.lookup(system_cfg.solver_prompts, "system.solver_prompts")
        verifier = AGENT_ROLES.lookup(system_cfg.verifier_prompts, "system.verifier_prompts")
        self.solver: RoleAgent = solver(system_cfg)
        self.verifier: RoleAgent = verifier(system_cfg)

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Yield solver/verifier turns until approval or round K, then return the graded outcome."""
        episode = _Episode()
        approved = False
        solution = ""
        rounds = 0
        for rounds in range(1, self.max_rounds + 1):
            solution = yield from self._call(self.solver, self.solver_name, problem, episode)
            if rounds == self.max_rounds:
                break
            approved = yield from self._review(problem, episode)
            if approved:
                break
        return EpisodeOutcome(
            reward=float(self.task.grade(problem, solution)),
            turns=episode.turns,
            final_answer=self.solver.parse(solution) or "",
            info={
                "rounds": rounds,
                "approved": approved,
                "verifier_calls": episode.verifier_calls,
                "malformed_verdicts": episode.malformed_verdicts,
            },
        )

    def _review(self, problem: Problem, episode: _Episode) -> Generator[AgentTurn, str, bool]:
        """One verifier call; returns whether the episode counts as approved (malformed -> configured choice)."""
        text = yield from self._call(self.verifier, self.verifier_name, problem, episode)
        episode.verifier_calls += 1
        verdict = self.verifier.parse(text)
        if verdict is None:
            episode.malformed_verdicts += 1
            verdict = self.malformed_verdict
        return verdict == APPROVE

    def _call(
        self, agent: RoleAgent, name: str, problem: Problem, episode: _Episode
    ) -> Generator[AgentTurn, str, str]:
        """Ask agent `name` (playing `agent`'s role), record its validity and share its text with the team."""
        text = yield AgentTurn(agent=name, messages=agent.messages(problem, episode.context))
        text = text if text is not None else ""
        episode.turns.append(TurnResult(agent=name, text=text, valid=agent.is_valid(text)))
        episode.context.add(agent.role, text)
        return text


def _check_roles(agents_by_role: Mapping[str, str]) -> None:
    """Fail at construction, naming the role, when an agent for solver or verifier is not configured."""
    for role in ROLES:
        if not agents_by_role.get(role):
            known = ", ".join(f"{r}={n}" for r, n in agents_by_role.items()) or "none"
            raise ValueError(
                f"the math system needs an agent with role {role!r}; configured roles: {known}"
            )

