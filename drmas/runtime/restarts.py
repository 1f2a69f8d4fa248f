"""When a pipeline process dies, restart it or end the run: the decision, without processes or clocks.

The pipeline is built to survive its processes coming and going (rollouts join and leave, a learner resumes
from its checkpoint, clients ride out a buffer restart), so a launcher restarts what died instead of
stopping everything. Restarts are bounded per process (`max_restarts`), spaced by a doubling backoff (a
process that dies at once does not spin), and never attempted for a process that refused its input (exit
code 2: a config error or a bad path fails the same way every time). A learner that exits 0 has finished.
Every launcher (local processes, Ray actors) applies the same policy, and so does a rollout to the agent program
it runs for the external system (`drmas.gateway.program`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from drmas.config.restarts import RestartConfig

EXIT_USAGE = 2  # what every drmas entry point returns for a config error, a bad path or a refused input


@dataclass(frozen=True)
class Decision:
    """What to do about a process that exited: restart it after `delay_s`, or end the run because `why`."""

    restart: bool
    delay_s: float = 0.0
    attempt: int = 0  # the restart this would be (1 = first)
    why: str = ""


class RestartBook:
    """Counts the restarts of every process and decides about the next one."""

    def __init__(self, config: RestartConfig, where: str = "pipeline.restarts") -> None:
        """`where`: the config section `config` was read from, named in the messages."""
        config.validate(where)
        self.config, self.where = config, where
        self.restarts: dict[str, int] = {}

    def after_exit(self, name: str, exit_code: Optional[int]) -> Decision:
        """The decision for `name`, which exited with `exit_code` (negative: killed by that signal)."""
        done = self.restarts.get(name, 0)
        if exit_code == EXIT_USAGE:
            return Decision(False, why=f"{name} refused its input (exit code {EXIT_USAGE}): a restart would fail "
                                       "the same way; see its message above")
        if done >= self.config.max_restarts:
            return Decision(False, why=f"{name} exited with code {exit_code} after {done} restarts "
                                       f"({self.where}.max_restarts={self.config.max_restarts})")
        self.restarts[name] = done + 1
        delay = min(self.config.backoff_s * 2**done, self.config.max_backoff_s)
        return Decision(True, delay_s=delay, attempt=done + 1)
