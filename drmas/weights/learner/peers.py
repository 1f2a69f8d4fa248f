"""The learner's book of joined rollouts: one `Peer` per pair, and the `PeerTable` every thread consults.

Part of the learner side of the weight channel (see ``sender.py`` for the protocol and its threads). All
peer state is guarded by the registry's one condition variable, which is also what every waiter waits on.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from drmas.weights import messages as msg
from drmas.weights.transport import PairGroup

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Peer:
    """The learner's view of one joined rollout (one pair)."""

    receiver_id: str
    routing_id: bytes
    pair_id: str
    last_seen: float
    ranks: int = 1  # receiving ranks the rollout brings (the group has 1 + ranks members)
    pair: PairGroup | None = None  # set once the group is built (the peer is then "connected")
    busy: bool = False  # a transfer is using the pair: only that transfer may close it
    drop_reason: str | None = None
    needs_sync: bool = False  # joined, not yet given the current weights
    ready_version: int | None = None
    ack: msg.Applied | None = None
    acked_version: int | None = None
    relay: bool = True  # may take a place in a relay chain (see relay.py)

    @property
    def connected(self) -> bool:
        return self.pair is not None and self.drop_reason is None


class PeerTable:
    """The joined rollouts, their state, and the one condition variable every waiter uses."""

    def __init__(self, send: Callable[[Peer, msg.Message], None]) -> None:
        self.cond = threading.Condition()
        self._by_id: dict[str, Peer] = {}
        self._by_pair: dict[str, Peer] = {}
        self._send = send

    def add(self, peer: Peer) -> None:
        """Register a new pair; an earlier pair of the same rollout (a restart) is dropped."""
        with self.cond:
            old = self._by_id.get(peer.receiver_id)
            if old is not None:
                self.drop(old, "replaced by a new Join of the same receiver", tell=False)
            self._by_id[peer.receiver_id] = peer
            self._by_pair[peer.pair_id] = peer

    def by_pair(self, pair_id: str) -> Peer | None:
        with self.cond:
            return self._by_pair.get(pair_id)

    def connected(self) -> list[Peer]:
        with self.cond:
            return [p for p in self._by_id.values() if p.connected]

    def all(self) -> list[Peer]:
        with self.cond:
            return list(self._by_id.values())

    def drop(self, peer: Peer, reason: str, tell: bool = True) -> None:
        """Forget ``peer``; close its pair unless a transfer holds it (that transfer closes it when done).

        ``tell`` sends it a Rejoin so a live rollout re-joins at once instead of waiting for a timeout.
        """
        with self.cond:
            if peer.drop_reason is not None:
                return
            peer.drop_reason = reason
            if self._by_id.get(peer.receiver_id) is peer:
                del self._by_id[peer.receiver_id]
            self._by_pair.pop(peer.pair_id, None)
            if not peer.busy and peer.pair is not None:
                peer.pair.close()
            self.cond.notify_all()
        log.info("weights: dropped receiver %s (pair %s): %s", peer.receiver_id, peer.pair_id, reason)
        if tell:
            self._send(peer, msg.Rejoin(peer.pair_id, reason))

    def release(self, peers: Sequence[Peer]) -> None:
        """End a transfer's hold on ``peers``; close the pairs of those dropped meanwhile."""
        with self.cond:
            for peer in peers:
                peer.busy = False
                if peer.drop_reason is not None and peer.pair is not None:
                    peer.pair.close()

    def expire(self, now: float, silence_s: float) -> None:
        """Drop connected peers not heard from for ``silence_s`` (killed, hung, or partitioned)."""
        for peer in self.connected():
            if now - peer.last_seen > silence_s:
                self.drop(peer, f"silent for {now - peer.last_seen:.1f} s")
