"""Admission control: how many new groups producers may start, per the staleness bound of every model.

One group of a multi-agent episode feeds every model whose agents it calls, so a grant must respect all
models at once: it is the minimum of `drmas.core.staleness.admission_capacity` over the models.

Bookkeeping per model (see `admission_capacity` for why these numbers):

* ``version``  the latest version its learner reported (`VersionUpdate`), 0 before any report.
* ``accepted`` complete groups that contain samples of the model, minus groups dropped before
  training (they must be replaced, or the learner would wait forever for its step's groups). On a
  version report it is raised to at least ``version * groups_per_step``: a learner at version v has
  consumed that many, which restores the budget after a buffer restart.
* ``incarnation`` the learner process that reported last. A report from a new one (a learner restarted,
  possibly from an older checkpoint, so its version may go *down*) recounts ``accepted`` as
  ``version * groups_per_step`` plus the model's groups still queued here: whatever the old process had
  pulled and not trained died with it. Without the recount a learner resumed at version 0 after its peer
  reached version 12 would find its budget spent for good and the run would hang.
* ``finished`` models whose learner reached its last step. They no longer bound the grant: a peer
  learner that restarted behind them still needs groups after they stop consuming.
* ``running`` (shared by all models) admitted groups not yet complete: units of a lease, then, once
  the group's first episode arrives, the group itself until it completes or is abandoned. Lease units
  never claimed within the lease timeout are returned, so a crashed producer cannot hold the budget.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from drmas.core.staleness import admission_capacity, is_too_stale


@dataclass
class _Lease:
    expires_at: float
    units: int


class AdmissionController:
    """Grants, leases and per-model counters behind `AdmitRequest` and the stale-drop rule."""

    def __init__(
        self,
        agent_models: Mapping[str, str],
        groups_per_step: Mapping[str, int],
        max_staleness: Optional[int],
        max_running: Optional[int],
        lease_timeout_s: float,
        drop_memory: int = 100_000,
    ) -> None:
        self.models = sorted(set(agent_models.values()))
        if max_staleness is not None:
            missing = [m for m in self.models if groups_per_step.get(m, 0) <= 0]
            if missing:
                raise ValueError(f"groups_per_step must be > 0 for every model under a staleness bound: {missing}")
        self.max_staleness = max_staleness
        self.max_running = max_running
        self.groups_per_step = dict(groups_per_step)
        self.lease_timeout_s = lease_timeout_s
        self.versions: dict[str, int] = {m: 0 for m in self.models}
        self.accepted: dict[str, int] = {m: 0 for m in self.models}
        self.incarnations: dict[str, str] = {}
        self.finished: set[str] = set()
        self.running = 0
        self.granted_total = 0
        self.expired_total = 0
        self._leases: dict[str, deque[_Lease]] = {}
        self._dropped: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._drop_memory = drop_memory

    # ---- grants -----------------------------------------------------------------------------------

    def capacity(self) -> Optional[int]:
        """Groups that may start now (None = unbounded: no staleness bound and no running cap)."""
        if self.max_staleness is None or not self.models:
            return None if self.max_running is None else max(self.max_running - self.running, 0)
        training = [m for m in self.models if m not in self.finished]
        if not training:
            return 0  # every learner is done: nothing generated now could be trained
        return min(
            admission_capacity(
                self.max_staleness,
                self.versions[m],
                self.groups_per_step[m],
                self.accepted[m],
                self.running,
                self.max_running,
            )
            for m in training
        )

    def grant(self, producer: str, n_groups: int, now: float) -> int:
        """Grant up to `n_groups` to `producer` and lease them until it starts them (or the lease expires)."""
        capacity = self.capacity()
        granted = n_groups if capacity is None else min(n_groups, capacity)
        if granted > 0:
            self._leases.setdefault(producer, deque()).append(_Lease(now + self.lease_timeout_s, granted))
            self.running += granted
            self.granted_total += granted
        return granted

    def claim(self, producer: str) -> bool:
        """A new group of `producer` started arriving: move one lease unit onto it, if it holds one."""
        leases = self._leases.get(producer)
        if not leases:
            return False
        leases[0].units -= 1
        if leases[0].units == 0:
            leases.popleft()
        return True

    def expire(self, now: float) -> int:
        """Return unclaimed lease units past their timeout to the budget; returns how many."""
        returned = 0
        for leases in self._leases.values():
            while leases and leases[0].expires_at <= now:
                returned += leases.popleft().units
        self.running -= returned
        self.expired_total += returned
        return returned

    def release_producer(self, producer: str) -> int:
        """Return every lease unit `producer` still holds (it disconnected); returns how many."""
        returned = sum(lease.units for lease in self._leases.pop(producer, ()))
        self.running -= returned
        self.expired_total += returned
        return returned

    # ---- group outcomes ---------------------------------------------------------------------------

    def on_complete(self, models: Iterable[str], leased: bool) -> None:
        if leased:
            self.running -= 1
        for model in models:
            if model in self.accepted:
                self.accepted[model] += 1

    def on_abandoned(self, leased: bool) -> None:
        if leased:
            self.running -= 1

    def on_dropped(self, group_id: str, model: str) -> None:
        """A group's part for `model` was dropped before training: give its budget slot back, once."""
        key = (group_id, model)
        if model not in self.accepted or key in self._dropped:
            return
        self._dropped[key] = None
        if len(self._dropped) > self._drop_memory:
            self._dropped.popitem(last=False)
        self.accepted[model] = max(self.accepted[model] - 1, 0)

    # ---- versions ---------------------------------------------------------------------------------

    def knows_model(self, model: str) -> bool:
        return model in self.versions

    def update_version(self, model: str, version: int, incarnation: str = "", finished: bool = False,
                       queued_groups: int = 0) -> bool:
        """Follow a learner's version report; `queued_groups` = the model's complete groups still held here.

        Returns whether the report came from a learner process not heard from before (the budget was
        recounted)."""
        self.versions[model] = version
        if finished:
            self.finished.add(model)
        else:
            self.finished.discard(model)
        new_learner = bool(incarnation) and self.incarnations.get(model) != incarnation
        if incarnation:
            self.incarnations[model] = incarnation
        if model in self.accepted and model in self.groups_per_step:
            consumed = version * self.groups_per_step[model]
            if new_learner:
                self.accepted[model] = consumed + queued_groups
            else:
                self.accepted[model] = max(self.accepted[model], consumed)
        return new_learner

    def stale_reason(self, model: str, oldest_version: int) -> Optional[str]:
        """'stale' when data of `oldest_version` may no longer train `model` (None: deliver it)."""
        if self.max_staleness is None or model not in self.versions:
            return None
        return "stale" if is_too_stale(oldest_version, self.versions[model], self.max_staleness) else None
