"""The relay chain: how one push reaches many rollouts while the learner sends each byte once.

Why a chain and not one broadcast group over the learner and all rollouts: gloo's broadcast
(``gloo/broadcast.cc``) is a binomial tree, so its root sends the whole buffer ceil(log2(n + 1)) times to n
receivers; measured with ``bench/fanout.py``, a learner wrote 1.0x, 2.0x and 3.0x the payload to 1, 2 and
4 receivers. (NCCL pipelines its broadcast, but a group over every rollout would also have to be rebuilt on
every join, leave and death, by all of them at once.) In a chain the learner sends each unit to the first
rollout only; every rollout passes each unit on to the next one as soon as it has it, while its engine
copies it in, so the units flow down the chain pipelined: learner bytes are flat, and the push takes about
(units + rollouts - 1) unit times instead of units x rollouts.

The pieces:
- each hop between consecutive rollouts is a two-rank group on the learner's TCPStore (a `PairGroup`: the
  predecessor is rank 0 and broadcasts, i.e. sends; the successor is rank 1), so a hop is built and fails
  exactly like a pair and nothing else is resized. Hops are kept while the chain keeps its order
  (`HopNames`);
- the learner plans each wave's chain (`plan_wave`) once the wave's rollouts said Ready, and tells each its
  `Route` (from whom, to whom); it streams over the pair of the chain's head only;
- a rollout (`Hops`) builds or reuses its hops and passes every unit on (``ReceiveStream``'s forward).

Failures: a rollout that cannot pass units on still applies them and says so in its Applied (``forward_error``);
the learner then drops its successor from the push (told to re-join). A rollout whose predecessor failed
mid-transfer applied nothing usable; it closes its hops (so its own successor fails at once instead of at
its timeout) and acks with ``upstream_failed``; its pair with the learner is intact, so the learner sends the
version again to all such rollouts in a new chain within the same push. Rollouts whose engine workers
receive the weights themselves (`Join.relay` False) are served over their pairs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import NamedTuple

import torch.distributed as dist

from drmas.weights import messages as msg
from drmas.weights.learner.peers import Peer
from drmas.weights.transport import PairError, PairGroup, local_address_towards

# ------------------------------------------------------------------------------------------ learner side


@dataclass
class WavePlan:
    """How one wave of ready rollouts is served."""

    routes: list[tuple[Peer, msg.Route]] = field(default_factory=list)  # what to tell each relaying rollout
    targets: list[Peer] = field(default_factory=list)  # the learner streams over these peers' pairs
    successor: dict[str, Peer] = field(default_factory=dict)  # receiver id -> the rollout it passes units to


class HopNames:
    """Names the hops of each wave's chain (the store prefixes both ends build their group under).

    A hop group's rendezvous keys on the store serve one build only, so a hop that is built again needs a
    new name. A link of the previous wave keeps its name (both ends still hold that group: a rollout keeps
    exactly the hops of its last route); any other link, and every link after a wave where something failed
    (hops may then have been closed), gets a fresh one.
    """

    def __init__(self) -> None:
        self._previous: dict[tuple[str, str], str] = {}
        self._count = itertools.count()

    def wave(self, links: list[tuple[Peer, Peer]]) -> list[str]:
        names = {}
        for up, down in links:
            key = (up.pair_id, down.pair_id)
            names[key] = self._previous.get(key) or f"hop/{up.pair_id}/{down.pair_id}/{next(self._count)}"
        self._previous = names
        return list(names.values())

    def forget(self) -> None:
        self._previous = {}


def plan_wave(wave: list[Peer], version: int, fanout: str, names: HopNames) -> WavePlan:
    """One chain over the rollouts that can relay (in receiver-id order, so hops are reused across pushes),
    or (``fanout`` 'pairs') each over its own pair; rollouts that cannot relay always over their pairs."""
    plan = WavePlan()
    relaying = sorted((p for p in wave if p.relay), key=lambda p: p.receiver_id)
    plan.targets = [p for p in wave if not p.relay]
    if fanout == "pairs":
        names.wave([])
        plan.routes = [(p, msg.Route(p.pair_id, version)) for p in relaying]
        plan.targets += relaying
        return plan
    hops = names.wave(list(zip(relaying, relaying[1:])))
    for index, peer in enumerate(relaying):
        upstream = hops[index - 1] if index > 0 else ""
        downstream = hops[index] if index < len(hops) else ""
        plan.routes.append((peer, msg.Route(peer.pair_id, version, upstream, downstream)))
        if downstream:
            plan.successor[peer.receiver_id] = relaying[index + 1]
    if relaying:
        plan.targets.append(relaying[0])
    return plan


# ------------------------------------------------------------------------------------------ rollout side


class HopError(PairError):
    """The hop from the predecessor could not be built or failed: the learner's pair itself is fine."""


class Path(NamedTuple):
    """Where one update's units come from and where they go on to."""

    source: PairGroup  # the learner's pair, or the hop from the predecessor
    forward: PairGroup | None  # the hop to the successor, or None
    forward_error: str | None  # why there is no forward although the route names a successor
    via_hop: bool  # ``source`` is a hop (its failure is the predecessor's, not the pair's)


class Hops:
    """One rollout's hop groups to its neighbours in the chain, kept while the chain keeps its order."""

    def __init__(self, store: dist.Store, store_host: str, backend: str, timeout_s: float) -> None:
        self._store = store
        self._local = local_address_towards(store_host)
        self._backend = backend
        # Half the pair timeout, for building a hop and for every unit on it: when a neighbour hangs or died
        # after saying Ready, this rollout gives up on it (and goes on receiving from the learner) while the
        # learner is still waiting on this rollout, instead of both timing out together and the learner
        # dropping a healthy predecessor.
        self._timeout_s = max(timeout_s / 2, 1.0)
        self._groups: dict[str, PairGroup] = {}

    def path(self, route: msg.Route, pair: PairGroup) -> Path:
        """Build or reuse the hops ``route`` names (upstream first: chains are acyclic, so no two rollouts
        wait on each other); raises `HopError` when the upstream hop cannot be built."""
        keep = {route.upstream, route.downstream} - {""}
        for stale in [h for h in self._groups if h not in keep]:
            self._groups.pop(stale).close()
        source = pair
        if route.upstream:
            try:
                source = self._group(route.upstream, rank=1)
            except PairError as error:
                raise HopError(f"hop from the predecessor: {error}") from error
        forward, forward_error = None, None
        if route.downstream:
            try:
                forward = self._group(route.downstream, rank=0)
            except PairError as error:
                forward_error = f"hop to the successor: {error}"
        return Path(source, forward, forward_error, via_hop=bool(route.upstream))

    def _group(self, hop: str, rank: int) -> PairGroup:
        group = self._groups.get(hop)
        if group is None or group.closed:
            group = PairGroup.connect(self._store, hop, rank, self._backend, self._timeout_s, self._local)
            self._groups[hop] = group
        return group

    def close(self) -> None:
        """Release every hop (after a failure their state is unknown; the neighbours then fail fast)."""
        for group in self._groups.values():
            group.close()
        self._groups.clear()

