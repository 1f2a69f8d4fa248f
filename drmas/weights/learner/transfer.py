"""One transfer of the learner's weights to a set of rollouts: Manifest -> Ready -> Route -> units -> Applied.

See ``sender.py`` for where transfers come from (pushes and join syncs) and ``relay.py`` for how one
transfer's units reach several rollouts while the learner sends them once.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from drmas.config.weights import WeightSyncConfig
from drmas.weights import messages as msg
from drmas.weights.chunks import Layout, Packer, plan_units
from drmas.weights.learner.peers import Peer, PeerTable
from drmas.weights.learner.source import Weights, WeightSource, as_source
from drmas.weights.relay import HopNames, plan_wave
from drmas.weights.transport import PairError

log = logging.getLogger(__name__)

CurrentWeights = Callable[[], tuple[int, Weights]]
"""Returns ``(version, weights)`` (a `WeightSource` or named tensors) a newly joined rollout must receive."""

# Times one push serves a rollout whose predecessor in the relay chain keeps failing, before dropping it.
_MAX_ATTEMPTS = 3


@dataclass
class PushReport:
    """Outcome of one transfer. ``bytes`` is the tensor data sent to each rollout (tied weights once);
    ``learner_sends`` how many times the learner sent it (1 per relay chain or pair served, resends
    included), so the learner put about ``bytes * learner_sends`` on the wire."""

    version: int
    seconds: float
    bytes: int
    receivers_ok: list[str]
    receivers_dropped: list[str]
    receivers_failed: list[str] = field(default_factory=list)  # received, but their apply callback raised
    errors: dict[str, str] = field(default_factory=dict)  # receiver id -> why it was dropped or failed
    learner_sends: int = 0
    resent: list[str] = field(default_factory=list)  # got the version only in a resend (a predecessor failed)

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class Outcome:
    """Accumulates one transfer's per-rollout results."""

    def __init__(self) -> None:
        self.ok: list[str] = []
        self.dropped: list[str] = []
        self.failed: list[str] = []
        self.errors: dict[str, str] = {}
        self.sends = 0
        self.resent: set[str] = set()

    def drop(self, peer: Peer) -> None:
        if peer.receiver_id not in self.dropped:
            self.dropped.append(peer.receiver_id)
            self.errors[peer.receiver_id] = peer.drop_reason or "dropped"


MIN_GATHER_S = 0.05  # a rollout's longest idle wait between two looks for weights: one that idles is never late


class Transfer:
    """Runs one transfer (Manifest -> Ready -> unit broadcasts -> Applied) to a set of connected peers."""

    def __init__(self, registry: PeerTable, send: Callable[[Peer, msg.Message], None], cfg: WeightSyncConfig,
                 incarnation: str = "", dtype: torch.dtype | None = None) -> None:
        """``dtype``: the dtype floating-point tensors travel in (the engines' compute dtype); None: as they are."""
        self._registry = registry
        self._dtype = dtype
        self._send = send
        self._cfg = cfg
        self._incarnation = incarnation
        self._scratch: list[torch.Tensor] = []  # two unit buffers, kept across transfers
        self._hops = HopNames()
        self.pass_s: float | None = None  # how long the last pass over the weights took (see `gather_s`)

    @property
    def gather_s(self) -> float:
        """How long to wait, once a rollout is ready, for the others: `ready_gather_s` at most, and no longer
        than the last pass over the weights took. Serving the late ones in a pass of their own costs about
        that pass, while every second of waiting pauses the ready rollouts' generation; so no choice costs
        more than twice the better one, whoever turns out late. On a 2-core machine with a tiny model
        (a 10 ms pass) the fixed 0.5 s kept rollouts paused a third of the time (`bench/staleness.py`)."""
        if self.pass_s is None:
            return self._cfg.ready_gather_s
        return min(self._cfg.ready_gather_s, max(self.pass_s, MIN_GATHER_S))

    def run(self, peers: Sequence[Peer], version: int, weights: Weights) -> PushReport:
        """Send ``weights`` as ``version`` to ``peers``. The layout comes from the source's metadata; every
        wave served (and every resend to rollouts behind a broken relay) reads one pass of the source."""
        start = time.monotonic()
        source = as_source(weights, self._dtype)
        layout = plan_units(source.specs(), self._cfg.chunk_bytes)
        outcome = Outcome()
        with self._registry.cond:
            live = [p for p in peers if p.connected and not p.busy]
            for peer in live:
                peer.busy = True
        try:
            self._announce(live, version, layout)
            remaining, attempts = live, {p.receiver_id: 1 for p in live}
            deadline = start + self._cfg.ready_timeout_s
            while remaining:
                wave, remaining = self._await_ready(remaining, version, deadline, outcome)
                if not wave:
                    continue
                again = self._serve(wave, version, layout, source, outcome)
                for peer in list(again):
                    attempts[peer.receiver_id] += 1
                    if attempts[peer.receiver_id] > _MAX_ATTEMPTS:
                        self._registry.drop(peer, f"relay failed {_MAX_ATTEMPTS} times")
                        outcome.drop(peer)
                        again.remove(peer)
                if again:  # they are paused and waiting: serve them again in a new chain
                    outcome.resent.update(p.receiver_id for p in again)
                    self._announce(again, version, layout)
                    remaining = remaining + again
                    deadline = max(deadline, time.monotonic() + self._cfg.timeout_s)
        finally:
            self._registry.release(live)
        return PushReport(
            version=version,
            seconds=time.monotonic() - start,
            bytes=layout.payload_bytes,
            receivers_ok=sorted(outcome.ok),
            receivers_dropped=sorted(outcome.dropped),
            receivers_failed=sorted(outcome.failed),
            errors=outcome.errors,
            learner_sends=outcome.sends,
            resent=sorted(outcome.resent & set(outcome.ok)),
        )

    def _announce(self, peers: Sequence[Peer], version: int, layout: Layout) -> None:
        with self._registry.cond:
            for peer in peers:
                peer.ready_version, peer.ack = None, None
        for peer in peers:
            self._send(peer, msg.Manifest(peer.pair_id, version, layout, self._incarnation))

    def _serve(self, wave: list[Peer], version: int, layout: Layout, source: WeightSource,
               outcome: Outcome) -> list[Peer]:
        """Route ``wave`` (see ``relay.py``), stream one pass of ``source`` to the chain's head and the
        pair-only peers, collect the acks; returns the peers to serve again (their predecessor failed)."""
        plan = plan_wave(wave, version, self._cfg.fanout, self._hops)
        for peer, route in plan.routes:
            self._send(peer, route)
        outcome.sends += len(plan.targets)
        started = time.monotonic()
        with source.open() as tensors:
            if self._stream(plan.targets, layout, Packer(layout, tensors), outcome):  # a pass that reached someone
                self.pass_s = time.monotonic() - started
        again = self._await_acks([p for p in wave if p.drop_reason is None], version, outcome, plan.successor)
        if again or any(p.drop_reason is not None or p.ack is None or p.ack.forward_error for p in wave):
            self._hops.forget()  # some hops may have been closed: build the next chain's afresh
        return again

    def _await_ready(
        self, waiting: list[Peer], version: int, deadline: float, outcome: Outcome
    ) -> tuple[list[Peer], list[Peer]]:
        """Split ``waiting`` into (ready now, still waiting); drop peers that vanished or missed the deadline."""
        cond = self._registry.cond
        with cond:
            first_ready: float | None = None
            while True:
                for peer in [p for p in waiting if p.drop_reason is not None]:
                    outcome.drop(peer)
                waiting = [p for p in waiting if p.drop_reason is None]
                ready = [p for p in waiting if p.ready_version == version]
                now = time.monotonic()
                if ready and first_ready is None:
                    first_ready = now
                gather = self.gather_s
                if ready and (len(ready) == len(waiting) or now - first_ready >= gather):
                    return ready, [p for p in waiting if p not in ready]
                if not waiting:
                    return [], []
                if now >= deadline:
                    for peer in waiting:
                        self._registry.drop(peer, f"not ready within {self._cfg.ready_timeout_s:g} s")
                        outcome.drop(peer)
                    return [], []
                wake = deadline if first_ready is None else min(deadline, first_ready + gather)
                cond.wait(max(wake - now, 0.001))

    def _scratch_buffers(self, nbytes: int, device: torch.device) -> list[torch.Tensor]:
        if not self._scratch or self._scratch[0].numel() < nbytes or self._scratch[0].device != device:
            self._scratch = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
        return self._scratch

    def _stream(self, wave: list[Peer], layout: Layout, packer: Packer, outcome: Outcome) -> list[Peer]:
        """Broadcast every unit over the pairs of ``wave``; returns the peers that received all of them.

        Two units are on the wire at a time: unit i is packed into the buffer of unit i-2 (which is waited
        for first) while unit i-1 is still travelling, so the wire never idles while either side copies.
        Each unit's bytes are held until its broadcasts are done: a unit sent straight from a tensor's
        memory keeps that tensor alive, while a streamed source may let go of it once a later tensor is read.
        """
        live = list(wave)
        scratch = self._scratch_buffers(layout.chunk_bytes, live[0].pair.device)
        in_flight: list[tuple[list[tuple[Peer, dist.Work]], torch.Tensor]] = []
        sent = 0
        for index, unit in enumerate(layout.units):
            if unit.nbytes == 0:  # only empty tensors: the manifest says it all
                continue
            if len(in_flight) == 2:
                live = self._finish(in_flight.pop(0)[0], outcome, live)
            data = packer.unit_bytes(index, scratch[sent % 2])
            sent += 1
            works = []
            for peer in live:
                try:
                    works.append((peer, peer.pair.broadcast(data)))
                except PairError as error:
                    self._fail(peer, error, outcome)
            live = [peer for peer, _ in works]
            in_flight.append((works, data))
            if not live:
                break
        for works, _ in in_flight:
            live = self._finish(works, outcome, live)
        return live

    def _finish(self, works: list[tuple[Peer, dist.Work]], outcome: Outcome, live: list[Peer]) -> list[Peer]:
        """Wait for one unit on every peer it was sent to; returns ``live`` minus the peers it failed on."""
        for peer, work in works:
            if peer not in live:
                continue  # already failed on an earlier unit
            try:
                peer.pair.wait(work)
            except PairError as error:
                self._fail(peer, error, outcome)
                live = [p for p in live if p is not peer]
        return live

    def _fail(self, peer: Peer, error: Exception, outcome: Outcome) -> None:
        self._registry.drop(peer, f"broadcast failed: {error}")
        outcome.drop(peer)

    def _await_acks(self, peers: list[Peer], version: int, outcome: Outcome, successor: dict[str, Peer]) -> list[Peer]:
        """Collect the acks of ``peers``; returns those whose predecessor in the chain failed. A rollout that
        could not pass the units on gets its successor dropped (the successor may be what failed)."""
        deadline = time.monotonic() + self._cfg.timeout_s
        cond = self._registry.cond
        again: list[Peer] = []
        with cond:
            waiting = list(peers)
            while waiting:
                for peer in list(waiting):
                    ack = peer.ack
                    if peer.drop_reason is not None:
                        outcome.drop(peer)
                    elif ack is not None and ack.version == version:
                        if ack.upstream_failed:
                            again.append(peer)
                        elif ack.ok:
                            outcome.ok.append(peer.receiver_id)
                            peer.acked_version = version
                        else:
                            outcome.failed.append(peer.receiver_id)
                            outcome.errors[peer.receiver_id] = f"apply failed: {ack.error}"
                        following = successor.get(peer.receiver_id)
                        if ack.forward_error and not ack.upstream_failed and following in waiting:
                            self._registry.drop(following, f"relay from {peer.receiver_id} failed: {ack.forward_error}")
                    else:
                        continue
                    waiting.remove(peer)
                left = deadline - time.monotonic()
                if not waiting:
                    return again
                if left <= 0:
                    for peer in waiting:
                        self._registry.drop(peer, f"no acknowledgement within {self._cfg.timeout_s:g} s")
                        outcome.drop(peer)
                    return again
                cond.wait(left)
        return again


def sync_newcomers(registry: PeerTable, broadcaster: Transfer, provider: CurrentWeights) -> PushReport | None:
    """Give the current weights to the rollouts that connected and still need them; None when there are
    none. The caller holds the transfer lock (a push may have served them while it waited for it)."""
    peers = [p for p in registry.connected() if p.needs_sync]
    if not peers:
        return None
    with registry.cond:
        for peer in peers:
            peer.needs_sync = False
    version, weights = provider()
    report = broadcaster.run(peers, version, weights)
    log.info("weights: join sync of version %d to %s in %.2f s (dropped: %s)",
             report.version, report.receivers_ok, report.seconds, report.receivers_dropped)
    return report


class JoinSync(threading.Thread):
    """Gives the current weights to rollouts that just connected (late joiners and restarted rollouts), when
    the provider's weights may be read from any thread (see `drmas.weights.learner.source`)."""

    def __init__(
        self, registry: PeerTable, broadcaster: Transfer, provider: CurrentWeights, transfer_lock: threading.RLock
    ) -> None:
        super().__init__(name="drmas-weights-join-sync", daemon=True)
        self._registry = registry
        self._broadcaster = broadcaster
        self._provider = provider
        self._transfer_lock = transfer_lock
        self.stopping = threading.Event()

    def run(self) -> None:
        cond = self._registry.cond
        while not self.stopping.is_set():
            with cond:
                cond.wait_for(lambda: self.stopping.is_set()
                              or any(p.needs_sync for p in self._registry.connected()), timeout=0.5)
            if self.stopping.is_set():
                return
            with self._transfer_lock:
                if self.stopping.is_set():
                    continue
                try:
                    sync_newcomers(self._registry, self._broadcaster, self._provider)
                except Exception:  # a faulty provider must not kill the thread; the rollout gets the next push
                    log.exception("weights: join sync failed")
