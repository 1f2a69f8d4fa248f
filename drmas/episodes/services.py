"""Tool calls of live episodes: one batched call per tool for all the episodes waiting on it, and the wait for
answers that come from outside.

A tool (`ToolCall`, e.g. a retrieval) serves many episodes at once, so its requests are gathered across
episodes and answered in one `call_batch`; a batch that raises is retried one request at a time, so only the
episodes whose own request raises are dropped (`drmas.episodes.failures.call_isolated`). Episodes whose turns
come from outside (an agent program calling the rollout's HTTP gateway) wait on a tool that answers `PENDING`
until the program's next call arrives; when no engine has work the loop sleeps in that tool's
`wait_for_answers` instead of spinning, and since that method gathers the calls of the episodes an engine just
answered, HTTP calls share engine steps the way in-process turns do.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from drmas.mas.base import PENDING, ToolCall
from drmas.episodes.failures import EpisodeFailure, ToolFailed, call_isolated
from drmas.episodes.isolation import STUCK, PluginCalls
from drmas.episodes.stepping import LiveEpisode


class ToolCalls:
    """Answers the tool calls of live episodes through `plugins` (every tool call is a plugin call)."""

    def __init__(self, tools: Mapping[str, object], plugins: PluginCalls) -> None:
        self.tools, self.plugins = tools, plugins

    def answer(self, live: list[LiveEpisode]) -> list[LiveEpisode]:
        """Answer every pending tool call, one batched call per tool, until each live episode waits on an
        agent turn (an episode may call tools several times in a row) or on an answer not there yet (PENDING:
        asked again next round); returns the episodes still live."""
        pending: list[LiveEpisode] = []
        while True:
            by_tool, ready = _by_tool(live)
            if not by_tool:
                return live + pending
            for tool, items in by_tool.items():
                for item, result in self._results(tool, items):
                    if result is PENDING:
                        pending.append(item)
                    else:
                        self.plugins.advance(item, result, ready)
            live = ready

    def wait_outside(self, waiting: list[LiveEpisode]) -> list[LiveEpisode]:
        """Sleep in the `wait_for_answers` of each tool whose answers come from outside (at once when no episode
        waits on one); returns `waiting` without the episodes dropped because such a wait blocked too long."""
        for tool, items in _by_tool(waiting)[0].items():
            wait = getattr(self.tools[tool], "wait_for_answers", None)
            if wait is not None and self.plugins.call(items, ("tool", tool, "wait_for_answers"), wait,
                                                      [item.turn.request for item in items]) is STUCK:
                gone = set(map(id, items))
                waiting = [item for item in waiting if id(item) not in gone]
        return waiting

    def _results(self, tool: str, items: list[LiveEpisode]) -> list[tuple[LiveEpisode, object]]:
        """One batched call of `tool` for `items`; the episodes whose request it fails on are dropped (all of them
        when it does not return in time)."""
        results = self.plugins.call(items, ("tool", tool, "call_batch"), call_isolated, tool,
                                    self.tools[tool].call_batch, [item.turn.request for item in items])
        if results is STUCK:
            return []
        answered = []
        for item, result in zip(items, results):
            if isinstance(result, ToolFailed):
                self.plugins.drop(item, EpisodeFailure(item.request, "tool", tool, result.at, result.error))
            else:
                answered.append((item, result))
        return answered


def _by_tool(items: list[LiveEpisode]) -> tuple[dict[str, list[LiveEpisode]], list[LiveEpisode]]:
    """The episodes waiting on a tool call, by tool, and the others, each in their order."""
    by_tool: dict[str, list[LiveEpisode]] = defaultdict(list)
    others: list[LiveEpisode] = []
    for item in items:
        if isinstance(item.turn, ToolCall):
            by_tool[item.turn.tool].append(item)
        else:
            others.append(item)
    return by_tool, others
