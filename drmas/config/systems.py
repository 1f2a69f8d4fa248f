"""The settings of the built-in multi-agent systems (`system.*` when `system.name` is math, math_revise, search).

Each is the `settings` its orchestra registers with (`drmas.mas.math`, `drmas.mas.revise`, `drmas.mas.search`);
they live here, with the other sections, so any process reads a built-in config without importing the
systems (see `drmas.config.sections`). The choices below are defined once: the checks and the orchestras
both use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from drmas.config.fields import help_field as _f
from drmas.config.sections import SYSTEM_SETTINGS, SystemSettings

VERDICTS = ("approve", "reject")  # system.malformed_verdict (math)
ROUTES = ("answer", "search")  # system.malformed_route (search)
QA_METRICS = ("em", "f1")  # system.reward_metric (search)


@dataclass
class MathSettings(SystemSettings):
    """The math system: solver and verifier take turns for up to max_rounds rounds."""

    name: str = SystemSettings.name_field("math")
    max_rounds: int = _f(2, "Solver/verifier rounds K; the verifier is skipped in the last round.")
    malformed_verdict: str = _f(
        "approve", "How a verifier output without a <verify> verdict counts: approve (reference) or reject.")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, max_rounds=1) + self.one_of(where, "malformed_verdict", VERDICTS)


@dataclass
class ReviseSettings(SystemSettings):
    """The math_revise system: solver, task-graded check, reviser only after a wrong answer."""

    name: str = SystemSettings.name_field("math_revise")
    max_rounds: int = _f(2, "Attempts in all: 1 solver call + up to max_rounds - 1 reviser calls.")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, max_rounds=1)


@dataclass
class SearchSettings(SystemSettings):
    """The search system: router, searcher and answerer over a retriever (`retrieval.*`)."""

    name: str = SystemSettings.name_field("search")
    max_turns: int = _f(4, "Router-routed turns; the search agent is skipped on the last turn.")
    route_last_turn: bool = _f(
        True, "The router also routes the last turn, as in the reference: 'no' there ends the episode without an "
        "answer (reward 0). false: the last turn goes straight to the answerer (router skipped).")
    malformed_route: str = _f(
        "answer", "How a router output without a <verify>yes|no</verify> verdict counts: answer (as 'yes', "
        "reference) or search (as 'no'). It is an invalid turn (format penalty) either way.")
    history_max_chars: int = _f(2000, "Most characters of the query/passage history shown to the agents (the newest "
                                "are kept).")
    reward_metric: str = _f("em", "Task reward of the final answer, 'em' (exact match) or 'f1' (token F1).")

    def problems(self, where: str) -> list[str]:
        return (self.at_least(where, max_turns=1, history_max_chars=1) + self.one_of(where, "malformed_route", ROUTES)
                + self.one_of(where, "reward_metric", QA_METRICS))


for _name, _cls in (("math", MathSettings), ("math_revise", ReviseSettings), ("search", SearchSettings)):
    SYSTEM_SETTINGS.adopt(_name, _cls)
