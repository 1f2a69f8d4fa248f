"""Credit-based flow control of producers: how a full buffer slows rollouts down without dropping data.

Every episode is acknowledged, and a producer keeps at most `window` episodes unacknowledged. While the
buffer holds `capacity_samples` or more, the ack of an episode that *opens a new group* is parked until
learners drain space; episodes of groups already started are still acknowledged, so a started group can
always complete (otherwise a full buffer of half-finished groups would deadlock, with learners unable to
drain anything). Held samples therefore exceed the capacity by at most the producers' in-flight windows
plus the rest of groups already started.

Credit is only advisory to a producer that ignores it (one sent 20,000 episodes without waiting and the
buffer held 156x its capacity), so it is also enforced here: a connection that already has `window` parked
acks is refused further new groups ('flow_control'), and no episode is stored beyond `hard_capacity`
samples ('buffer_full'). Connections, not producer names, are counted: a producer restarted under the same
name must not inherit the parked acks of its dead predecessor.

No sockets here: the server asks `check` before storing an episode and sends the acks `release` returns.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from drmas.buffer.messages import MessageError

REJECT_BUFFER_FULL = "buffer_full"
REJECT_FLOW_CONTROL = "flow_control"


@dataclass
class _ParkedAck:
    identity: bytes
    seq: int
    n_samples: int


class CreditGate:
    """Parked acknowledgements per connection and the two limits that back them."""

    def __init__(self, capacity_samples: int, hard_capacity: int, window: int) -> None:
        self.capacity_samples = capacity_samples
        self.hard_capacity = hard_capacity
        self.window = window
        self._parked: deque[_ParkedAck] = deque()
        self._parked_by_peer: defaultdict[bytes, int] = defaultdict(int)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def check(self, identity: bytes, held: int, n_samples: int, opens_group: bool) -> bool:
        """Whether an episode of `n_samples` may be stored now, `held` samples being in the buffer: False
        when it may be stored but its ack must be parked; `MessageError` when it must be refused."""
        park = opens_group and held >= self.capacity_samples
        if park and self._parked_by_peer[identity] >= self.window:
            raise MessageError(
                REJECT_FLOW_CONTROL,
                f"the buffer is full and this connection already has {self._parked_by_peer[identity]} "
                f"unacknowledged episodes (window {self.window}): wait for acknowledgements",
            )
        if held + n_samples > self.hard_capacity:
            raise MessageError(
                REJECT_BUFFER_FULL,
                f"holding {held} samples; {n_samples} more would pass the hard limit {self.hard_capacity} "
                "(pipeline.buffer.max_held_samples)",
            )
        return not park

    def park(self, identity: bytes, seq: int, n_samples: int) -> None:
        self._parked.append(_ParkedAck(identity, seq, n_samples))
        self._parked_by_peer[identity] += 1

    def release(self, held: int) -> list[tuple[bytes, int]]:
        """(connection, seq) of the parked acks to send now that `held` samples are in the buffer: credit goes
        back while space is free, each released ack letting its producer send about as much again."""
        budget = self.capacity_samples - held
        released = []
        while self._parked and budget > 0:
            parked = self._parked.popleft()
            budget -= parked.n_samples
            self._parked_by_peer[parked.identity] -= 1
            if not self._parked_by_peer[parked.identity]:
                del self._parked_by_peer[parked.identity]
            released.append((parked.identity, parked.seq))
        return released
