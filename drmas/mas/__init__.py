"""Multi-agent systems: agents (prompting + parsing of one role) and orchestras (turn logic of an episode)."""

from drmas.config.sections import SYSTEM_SETTINGS
from drmas.core.registry import Registry
from drmas.mas.base import AgentTurn, EpisodeOutcome, Orchestra, Service, ServiceCall, TurnResult

# name -> orchestra factory `(settings, agents_by_role, task) -> Orchestra`; `register(name, settings=C)` also
# makes C the settings class of `system.*` when `system.name` is that name
ORCHESTRAS: Registry = Registry("orchestra", settings=SYSTEM_SETTINGS)

__all__ = ["ORCHESTRAS", "AgentTurn", "EpisodeOutcome", "Orchestra", "Service", "ServiceCall", "TurnResult"]
