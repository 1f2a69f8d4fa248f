"""The multi-agent system interface.

An orchestra describes the turn logic of one episode as a Python generator: it *yields* an `AgentTurn`
(which agent speaks, with which chat messages) and is *sent* back the agent's response text; when the
episode is over it *returns* an `EpisodeOutcome`. The orchestra never touches engines, tokenizers or
processes, so one driver can interleave hundreds of episodes and batch their calls per engine, and the
same orchestra runs in the colocated loop, in rollout processes and in evaluation.

An episode may also yield a `ToolCall` (e.g. a retrieval) and is sent back the tool's result. Tools belong
to the orchestra (`Orchestra.tools`) but the driver makes the calls: it gathers the pending calls of all
live episodes and makes one batched call per tool, so a retrieval server sees one request per round rather
than one per episode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Mapping, Protocol, Sequence, Union

from drmas.tasks.base import Problem


@dataclass
class AgentTurn:
    """A request from the orchestra: agent `agent` answers `messages` (chat format)."""

    agent: str
    messages: list[dict]  # [{"role": "system"|"user"|"assistant", "content": str}, ...]


@dataclass
class ToolCall:
    """A request from the orchestra to its tool `tool` (a key of `Orchestra.tools`); the episode is sent
    back that tool's result for `request`. Tool calls are not agent turns: they produce no sample."""

    tool: str
    request: Any


class Tool(Protocol):
    """Something an orchestra's episodes call between agent turns, batched across episodes by the driver."""

    def call_batch(self, requests: Sequence[Any]) -> list[Any]:
        """One result per request, in order. An exception ends the driver's run, so a tool that can
        recover from a failure (e.g. by retrying) does so itself."""
        ...


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


EpisodeGenerator = Generator[Union[AgentTurn, ToolCall], Any, EpisodeOutcome]


class Orchestra(Protocol):
    """Turn logic of one multi-agent system; `agents` lists the agent names it needs, `tools` the tools
    its episodes call by name (empty for a system without any)."""

    agents: tuple[str, ...]
    tools: Mapping[str, Tool]

    def run(self, problem: Problem) -> EpisodeGenerator:
        """Yield AgentTurns (sent back response texts) and ToolCalls (sent back tool results); return the
        EpisodeOutcome."""
        ...
