"""The longest an episode may run, and what an episode past it becomes.

An orchestra is user code: one that never returns (it yields turns forever) or blocks (a `time.sleep`, a
deadlock, a service that never answers) would otherwise hold its episode, its GRPO group and, blocking, the whole
driver forever. So every episode has bounds (`rollout.*`, checked by the episode runner):

* `max_episode_turns` agent turns (LLM or scripted) and `max_episode_tool_calls` service calls: the turn past
  either is not served; the episode ends there;
* `episode_timeout_s` of wall time from its start, wherever the episode is when it passes (waiting for an
  engine, a service, or inside a plugin call);
* `plugin_call_timeout_s`: one plugin call (an episode step, a scripted reply, a service batch) blocks the driver
  at most this long, and never past the last deadline of the episodes it serves; the call is then abandoned
  in its thread (`drmas.episodes.plugin_thread`) and those episodes end. More than `max_stuck_plugin_calls`
  abandoned calls still blocked stop the process (`EpisodeFailures`), naming the last one.

An episode past a bound ends as a failing plugin's does (`drmas.episodes.failures`): dropped, logged once per
distinct bound and place (with the stack of the code that holds it), counted in `rollout/episodes_failed` and,
per reason (`REASONS`), in `rollout/episodes_over_bound/<reason>`. This module decides; the runner acts, the
plugin thread runs the calls.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Iterable, Optional

from drmas.config.schema import RolloutConfig
from drmas.mas.base import ServiceCall
from drmas.episodes.plugin_thread import where

REASONS = ("turns", "tool_calls", "time", "stuck")  # rollout/episodes_over_bound/<reason> (tool_calls: service calls)
SLOW_CALL_S = 60.0  # a plugin call running this long is logged (with its stack) while it is waited for


class OverBound(Exception):
    """Why an episode ended past a bound: `reason` (one of `REASONS`), and `stack`, where the plugin code that
    held it was (its generator's suspended frames, or a stuck call's thread) as traceback lines."""

    def __init__(self, reason: str, message: str, stack: traceback.StackSummary | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.stack = stack


@dataclass(frozen=True)
class EpisodeBounds:
    """The bounds of every episode of a runner (`rollout.*`, see the module docstring)."""

    max_turns: int
    max_tool_calls: int  # of service calls (rollout.max_episode_tool_calls: the key keeps its name)
    timeout_s: float
    call_timeout_s: float  # 0: plugin calls run in the driver's thread, unbounded
    max_stuck_calls: int

    @classmethod
    def from_config(cls, rollout: RolloutConfig) -> EpisodeBounds:
        return cls(rollout.max_episode_turns, rollout.max_episode_tool_calls, rollout.episode_timeout_s,
                   rollout.plugin_call_timeout_s, rollout.max_stuck_plugin_calls)

    def start(self, now: float) -> Budget:
        """The budget of an episode starting at `now`."""
        return Budget(self, now + self.timeout_s)

    def call_deadline(self, now: float, budgets: Iterable[Budget]) -> Optional[float]:
        """Until when a plugin call for the episodes of `budgets` may block: `plugin_call_timeout_s` from now, and
        no longer than the last of their deadlines (no episode would be left to wait for it). None: no bound."""
        if not self.call_timeout_s:
            return None
        last = max((budget.deadline for budget in budgets), default=None)
        return now + self.call_timeout_s if last is None else min(now + self.call_timeout_s, last)

    def expired(self, stack: traceback.StackSummary | None) -> OverBound:
        """The end of an episode that outlived its deadline while it waited (for an engine, a service, its turn)."""
        return OverBound("time", f"did not end within rollout.episode_timeout_s={self.timeout_s:g} s", stack)

    def stuck(self, now: float, budget: Budget, stack: traceback.StackSummary) -> OverBound:
        """The end of an episode whose plugin call was not back by its deadline: its own (`time`), or the
        plugin call bound's (`stuck`). The message names the innermost frame, so each place logs its stack once."""
        at = f"; blocked at {where(stack)}" if stack else ""
        if now >= budget.deadline:
            return OverBound("time", f"did not end within rollout.episode_timeout_s={self.timeout_s:g} s{at}", stack)
        return OverBound("stuck", f"a plugin call did not return within rollout.plugin_call_timeout_s="
                                  f"{self.call_timeout_s:g} s and was abandoned in its thread{at}", stack)

    def too_many_stuck(self, stuck: int) -> Optional[str]:
        """Why the process stops when `stuck` abandoned calls still block their threads (None: it goes on)."""
        if stuck <= self.max_stuck_calls:
            return None
        return (f"{stuck} plugin calls are stuck in threads they were abandoned in (rollout.max_stuck_plugin_calls="
                f"{self.max_stuck_calls}): a plugin hangs systematically")


@dataclass
class Budget:
    """What one episode has used of its bounds."""

    bounds: EpisodeBounds
    deadline: float  # time.monotonic() past which it ends
    turns: int = 0
    tool_calls: int = 0  # service calls, counted against max_tool_calls

    def count(self, turn: object) -> Optional[OverBound]:
        """Count the turn (an AgentTurn) or service call the episode asks for next; an OverBound if it is one too
        many."""
        if isinstance(turn, ServiceCall):
            self.tool_calls += 1
            if self.tool_calls > self.bounds.max_tool_calls:
                return OverBound("tool_calls", f"asked for service call {self.tool_calls}, past "
                                               f"rollout.max_episode_tool_calls={self.bounds.max_tool_calls}")
            return None
        self.turns += 1
        if self.turns > self.bounds.max_turns:
            return OverBound("turns", f"asked for agent turn {self.turns}, past rollout.max_episode_turns="
                                      f"{self.bounds.max_turns}")
        return None


DEFAULT_BOUNDS = EpisodeBounds.from_config(RolloutConfig())
