"""The multi-agent system interface.

An orchestra describes the turn logic of one episode as a Python generator: it *yields* an `AgentTurn`
(which agent speaks, with which chat messages) and is *sent* back the agent's response text; when the
episode is over it *returns* an `EpisodeOutcome`. The orchestra never touches engines, tokenizers or
processes, so one driver can interleave hundreds of episodes and batch their calls per engine, and the
same orchestra runs in the colocated loop, in rollout processes and in evaluation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generator, Protocol

from drmas.tasks.base import Problem


@dataclass
class AgentTurn:
    """A request from the orchestra: agent `agent` answers `messages` (chat format)."""

    agent: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]


@dataclass
class TurnResult:
    """What the orchestra decided about one answered turn (validity of the agent's output format)."""

    agent: str
    text: str
    valid: bool


@dataclass
class EpisodeOutcome:
    """The end of an episode: the task reward shared by all its calls, and per-turn validity."""

    reward: float  # task reward in [0, 1]
    turns: list[TurnResult]  # one per yielded AgentTurn, in order
    final_answer: str = ""
    info: dict = field(default_factory=dict)  # orchestra statistics (rounds used, approvals, ...)


EpisodeGenerator = Generator[AgentTurn, str, EpisodeOutcome]


class Orchestra(Protocol):
    """Turn logic of one multi-agent system; `agents` lists the agent names it needs."""

    agents: tuple[str, ...]

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Yield AgentTurns, receive response texts, return the EpisodeOutcome."""
        ...
