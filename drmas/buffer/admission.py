"""Admission control: how many new groups producers may start, per the staleness bound of every model.

One group of a multi-agent episode feeds every model whose agents it calls, so a grant must respect all
models at once: it is the minimum of `drmas.core.staleness.admission_capacity` over the models.

Bookkeeping per model (see `admission_capacity` for why these numbers):

* ``version``  the latest version its learner reported (`VersionUpdate`), 0 before any report.
* ``accepted`` complete groups that contain samples of the model, minus groups dropped before
  training (they must be replaced, or the learner would wait forever for its step's groups): a group
  counts as dropped once its last part for the model is, not at its first (`on_dropped`). On a
  version report it is raised to at least ``version * groups_per_step``: a learner at version v has
  consumed that many, which restores the budget after a buffer restart.
* ``incarnation`` the learner process that reported last. A report from a new one (a learner restarted,
  possibly from an older checkpoint, so its version may go *down*) recounts ``accepted`` as
  ``version * groups_per_step`` plus the model's groups still queued here: whatever the old process had
  pulled and not trained died with it. Without the recount a learner resumed at version 0 after its peer
  reached version 12 would find its budget spent for good and the run would hang.
* ``heard`` models whose learner has reported to this buffer process. Under a staleness bound nothing is
  granted before every training model's learner has: a buffer that restarted would otherwise grant on
  version 0 and hand out draws the learners have trained (`drmas.buffer.draws`) -- a wasted step of
  generation. Learners report first thing, and again as soon as they notice a new buffer.
* ``finished`` models whose learner reached its last step. They no longer bound the grant: a peer
  learner that restarted behind them still needs groups after they stop consuming.
* ``running`` (shared by all models) admitted groups not yet complete: units of a lease, then, once
  the group's first episode arrives, the group itself until it completes or is abandoned. Lease units
  never claimed within the lease timeout are returned, so a crashed producer cannot hold the budget.

A lease is a list of draw numbers (`drmas.buffer.draws`): a group claims the unit of its own draw, so the
buffer knows which draws an expired lease or a vanished producer leaves undone.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from drmas.core.staleness import admission_capacity, is_too_stale


@dataclass
class _Lease:
    expires_at: float
    draws: list[int]  # one unit per draw, claimed by the group of that draw


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
        self.heard: set[str] = set()
        self.finished: set[str] = set()
        self.running = 0
        self.granted_total = 0
        self.expired_total = 0
        self._leases: dict[str, deque[_Lease]] = {}
        self._dropped: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._parts_left: OrderedDict[tuple[str, str], int] = OrderedDict()  # (group, model) -> parts not dropped
        self._drop_memory = drop_memory

    # ---- grants -----------------------------------------------------------------------------------

    def capacity(self) -> Optional[int]:
        """Groups that may start now (None = unbounded: no staleness bound and no running cap)."""
        if self.max_staleness is None or not self.models:
            return None if self.max_running is None else max(self.max_running - self.running, 0)
        training = [m for m in self.models if m not in self.finished]
        if not training:
            return 0  # every learner is done: nothing generated now could be trained
        if any(m not in self.heard for m in training):
            return 0  # a learner this buffer has not heard from: its version and its trained draws are unknown
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

    def wanted(self, n_groups: int) -> int:
        """How many of `n_groups` may be granted now."""
        capacity = self.capacity()
        return n_groups if capacity is None else min(n_groups, capacity)

    def lease(self, producer: str, draws: list[int], now: float) -> None:
        """Lease the groups of `draws` to `producer` until it starts them (or the lease expires)."""
        if draws:
            self._leases.setdefault(producer, deque()).append(_Lease(now + self.lease_timeout_s, list(draws)))
            self.running += len(draws)
            self.granted_total += len(draws)

    def holds(self, producer: str, draw: int) -> bool:
        """Whether `producer` holds an unclaimed lease unit for `draw`."""
        return any(draw in lease.draws for lease in self._leases.get(producer, ()))

    def claim(self, producer: str, draw: int = -1) -> Optional[int]:
        """A new group of `producer` started arriving: move the lease unit of its `draw` onto it (-1, a group
        without a draw number: its oldest unit). Returns the draw of the unit claimed, None if it held none."""
        leases = self._leases.get(producer)
        if not leases:
            return None
        for lease in leases:
            if draw < 0 or draw in lease.draws:
                claimed = lease.draws[0] if draw < 0 else draw
                lease.draws.remove(claimed)
                if not lease.draws:
                    leases.remove(lease)
                return claimed
        return None

    def expire(self, now: float) -> list[int]:
        """Return unclaimed lease units past their timeout to the budget; returns their draws."""
        returned: list[int] = []
        for leases in self._leases.values():
            while leases and leases[0].expires_at <= now:
                returned += leases.popleft().draws
        self.running -= len(returned)
        self.expired_total += len(returned)
        return returned

    def release_producer(self, producer: str) -> list[int]:
        """Return every lease unit `producer` still holds (it disconnected); returns their draws."""
        returned = [draw for lease in self._leases.pop(producer, ()) for draw in lease.draws]
        self.running -= len(returned)
        self.expired_total += len(returned)
        return returned

    # ---- group outcomes ---------------------------------------------------------------------------

    def on_complete(self, models: Iterable[str], leased: bool, group_id: str = "",
                    parts: Optional[Mapping[str, int]] = None) -> None:
        """A group completed; `parts`: model -> how many of its agents' parts it has (see `on_dropped`)."""
        if leased:
            self.running -= 1
        for model in models:
            if model in self.accepted:
                self.accepted[model] += 1
        for model, n in (parts or {}).items():
            if n > 1:
                self._parts_left[group_id, model] = n
                if len(self._parts_left) > self._drop_memory:
                    self._parts_left.popitem(last=False)

    def on_abandoned(self, leased: bool) -> None:
        if leased:
            self.running -= 1

    def on_dropped(self, group_id: str, model: str, whole: bool = False) -> None:
        """A group's part for `model` was dropped before training: give its budget slot back, once, when the
        group leaves the model nothing to train -- its last part dropped, or (`whole`) a part of a group its
        learner does not count in a step (a draw drawn again for another agent, `drmas.learner.batch`). A group
        whose verifier part trained while its solver part was dropped was consumed: refunding it would let
        the rollouts start a group too many, too stale by the time it is trained."""
        key = (group_id, model)
        if model not in self.accepted or key in self._dropped:
            return
        left = self._parts_left.get(key, 1)
        if left > 1 and not whole:
            self._parts_left[key] = left - 1
            return
        self._parts_left.pop(key, None)
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
        self.heard.add(model)
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
