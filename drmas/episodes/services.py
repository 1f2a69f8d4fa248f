"""Service calls of live episodes: one batched call per service for all the episodes waiting on it, and the wait
for answers that come from outside.

A service (`ServiceCall`, e.g. a retrieval) serves many episodes at once, so its requests are gathered across
episodes and answered in one `call_batch`; a batch that raises is retried one request at a time, so only the
episodes whose own request raises are dropped (`drmas.episodes.failures.call_isolated`). Episodes whose turns
come from outside (an agent program calling the rollout's HTTP gateway) wait on a service that answers `PENDING`
until the program's next call arrives; when no engine has work the loop sleeps in that service's
`wait_for_answers` instead of spinning, and since that method gathers the calls of the episodes an engine just
answered, HTTP calls share engine steps the way in-process turns do.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from typing import Mapping

from drmas.mas.base import PENDING, ServiceCall
from drmas.episodes.failures import EpisodeFailure, ServiceFailed, call_isolated
from drmas.episodes.isolation import STUCK, PluginCalls
from drmas.episodes.stepping import LiveEpisode


def orchestra_services(orchestra: object) -> dict[str, object]:
    """The orchestra's services by name: its `services`, else (deprecated, with a DeprecationWarning) its `tools`,
    the name they had before they were services; none when it has neither."""
    services = getattr(orchestra, "services", None)
    if services is None and getattr(orchestra, "tools", None) is not None:
        warnings.warn(f"{type(orchestra).__name__}.tools is deprecated: name the orchestra's services mapping "
                      "`services`", DeprecationWarning, stacklevel=2)
        services = orchestra.tools  # type: ignore[attr-defined]
    return dict(services or {})


class ServiceCalls:
    """Answers the service calls of live episodes through `plugins` (every service call is a plugin call)."""

    def __init__(self, services: Mapping[str, object], plugins: PluginCalls) -> None:
        self.services, self.plugins = services, plugins

    def answer(self, live: list[LiveEpisode]) -> list[LiveEpisode]:
        """Answer every pending service call, one batched call per service, until each live episode waits on an
        agent turn (an episode may call services several times in a row) or on an answer not there yet (PENDING:
        asked again next round); returns the episodes still live."""
        pending: list[LiveEpisode] = []
        while True:
            by_service, ready = _by_service(live)
            if not by_service:
                return live + pending
            for service, items in by_service.items():
                for item, result in self._results(service, items):
                    if result is PENDING:
                        pending.append(item)
                    else:
                        self.plugins.advance(item, result, ready)
            live = ready

    def wait_outside(self, waiting: list[LiveEpisode]) -> list[LiveEpisode]:
        """Sleep in the `wait_for_answers` of each service whose answers come from outside (at once when no episode
        waits on one); returns `waiting` without the episodes dropped because such a wait blocked too long."""
        for service, items in _by_service(waiting)[0].items():
            wait = getattr(self.services[service], "wait_for_answers", None)
            if wait is not None and self.plugins.call(items, ("service", service, "wait_for_answers"), wait,
                                                      [item.turn.request for item in items]) is STUCK:
                gone = set(map(id, items))
                waiting = [item for item in waiting if id(item) not in gone]
        return waiting

    def _results(self, service: str, items: list[LiveEpisode]) -> list[tuple[LiveEpisode, object]]:
        """One batched call of `service` for `items`; the episodes whose request it fails on are dropped (all of
        them when it does not return in time)."""
        results = self.plugins.call(items, ("service", service, "call_batch"), call_isolated, service,
                                    self.services[service].call_batch, [item.turn.request for item in items])
        if results is STUCK:
            return []
        answered = []
        for item, result in zip(items, results):
            if isinstance(result, ServiceFailed):
                self.plugins.drop(item, EpisodeFailure(item.request, "service", service, result.at, result.error))
            else:
                answered.append((item, result))
        return answered


def _by_service(items: list[LiveEpisode]) -> tuple[dict[str, list[LiveEpisode]], list[LiveEpisode]]:
    """The episodes waiting on a service call, by service, and the others, each in their order."""
    by_service: dict[str, list[LiveEpisode]] = defaultdict(list)
    others: list[LiveEpisode] = []
    for item in items:
        if isinstance(item.turn, ServiceCall):
            by_service[item.turn.service].append(item)
        else:
            others.append(item)
    return by_service, others
