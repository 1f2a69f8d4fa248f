"""`pipeline.restarts`: how often `drmas run` restarts a dead pipeline process (the policy: `drmas.runtime.restarts`)."""

from __future__ import annotations

from dataclasses import dataclass

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f


@dataclass
class RestartConfig(Section):
    max_restarts: int = _f(3, "Restarts of one process (a rollout, a learner, the buffer) before the run is "
                           "stopped; 0 = stop the run at the first death. A learner restarts with trainer.resume=true.")
    backoff_s: float = _f(2.0, "Wait before restarting a process the first time; doubled for each later restart of it.")
    max_backoff_s: float = _f(60.0, "Longest wait before a restart.")

    def problems(self, where: str) -> list[str]:
        found = []
        if self.max_restarts < 0:
            found.append(f"{where}.max_restarts: must be >= 0, got {self.max_restarts}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            found.append(f"{where}: needs 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}")
        return found
