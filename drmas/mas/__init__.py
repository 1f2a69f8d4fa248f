"""Multi-agent systems: agents (prompting + parsing of one role) and orchestras (turn logic of an episode)."""

from drmas.core.registry import Registry
from drmas.mas.base import AgentTurn, EpisodeOutcome, Orchestra, Tool, ToolCall, TurnResult

ORCHESTRAS: Registry = Registry("orchestra")

__all__ = ["ORCHESTRAS", "AgentTurn", "EpisodeOutcome", "Orchestra", "Tool", "ToolCall", "TurnResult"]
