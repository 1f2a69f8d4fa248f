"""Receiving one update's broadcast units over a pair group and turning them back into named tensors.

Used wherever a member of a pair receives: the rollout process itself (`WeightReceiver`), or each worker of
an engine that receives in its workers (`drmas.weights.rollout.member`). In a relay chain (``relay.py``) the units
come from the predecessor's hop instead, and each one is passed on to the successor's hop as soon as it is
in, while the consumer copies it.
"""

from __future__ import annotations

from collections import deque
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from drmas.weights.chunks import BufferPool, Layout, Unpacker
from drmas.weights.relay import HopError, Path
from drmas.weights.transport import PairError, PairGroup


class TransferError(RuntimeError):
    """The pair failed while the consumer was taking an update's tensors."""


class ReceiveStream:
    """Receives one update's units over ``pair`` and yields its named tensors.

    Up to ``AHEAD`` units are posted ahead of the one being consumed, so the wire keeps moving while the
    consumer copies. `finish` then receives whatever the consumer did not ask for, so the pair stays in step
    with the learner even if the consumer stopped early or raised.
    """

    AHEAD = 2
    FORWARD_AHEAD = 2  # units being passed on to the successor at a time (their buffers stay unreused)
    # buffers a pool needs: posted ahead + the one consumed + one the consumer may view + those being forwarded
    POOL_KEEP = AHEAD + 2 + FORWARD_AHEAD

    def __init__(self, pair: PairGroup, layout: Layout, pool: BufferPool,
                 on_start: Callable[[], Path | None] = lambda: None,
                 broken: Callable[[], str | None] = lambda: None) -> None:
        """``on_start`` runs once, just before the first receive is posted (the rollout then tells the learner
        it is Ready); it may return the relay `Path` to take the units from and pass them on to (None: from
        ``pair``, nothing passed on). ``broken`` says why the pair must not be used any more (None while it
        may)."""
        self._pair = pair
        self._forward: PairGroup | None = None
        self._forwarding: deque[tuple[dist.Work, torch.Tensor]] = deque()  # in flight to the successor
        self.forward_error: str | None = None  # why (some) units were not passed on
        self.via_hop = False  # units come from the predecessor: a failure is its, not the pair's
        self._layout = layout
        self._unpacker = Unpacker(layout, pool)
        self._on_start = on_start
        self._broken = broken
        self._started = False
        self._next = 0  # first unit not yet posted
        self._posted: deque[tuple[int, dist.Work | None, torch.Tensor]] = deque()  # posted, not waited, in order
        self._generator: Iterator[tuple[str, torch.Tensor]] | None = None
        self.failed: str | None = None

    @staticmethod
    def pool_for(layout: Layout, device: torch.device, current: BufferPool | None = None) -> BufferPool:
        """``current`` if it fits ``layout``'s chunk size, else a new pool (reused across updates)."""
        if current is not None and current.nbytes == layout.chunk_bytes:
            return current
        return BufferPool(layout.chunk_bytes, device, keep=ReceiveStream.POOL_KEEP)

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        reason = self._broken()
        if reason is not None:
            raise PairError(f"pair unusable: {reason}")
        path = self._on_start()
        if path is not None:
            self._pair, self._forward, self.forward_error, self.via_hop = path

    def _pass_on(self, data: torch.Tensor) -> None:
        """Start sending a received unit to the successor; a failure stops forwarding, not receiving."""
        if self._forward is None:
            return
        try:
            if len(self._forwarding) >= self.FORWARD_AHEAD:
                self._forward.wait(self._forwarding.popleft()[0])
            self._forwarding.append((self._forward.broadcast(data), data))
        except PairError as error:
            self._stop_forwarding(error)

    def _stop_forwarding(self, error: Exception) -> None:
        self.forward_error = f"passing units on failed: {error}"
        self._forwarding.clear()
        self._forward.close()
        self._forward = None

    def _drain_forwards(self) -> None:
        try:
            while self._forwarding and self._forward is not None:
                self._forward.wait(self._forwarding.popleft()[0])
        except PairError as error:
            self._stop_forwarding(error)
        self._forwarding.clear()

    def _post_up_to(self, depth: int, target_of: Callable[[int], torch.Tensor]) -> None:
        while len(self._posted) < depth and self._next < len(self._layout.units):
            index = self._next
            self._next += 1
            target = target_of(index)
            work = self._pair.broadcast(target) if self._layout.units[index].nbytes else None
            self._posted.append((index, work, target))

    def _wait_oldest(self) -> int:
        """Wait for the oldest posted unit and start passing it on (its buffer stays viewed, hence unreused,
        until that send is done)."""
        index, work, target = self._posted.popleft()
        if work is not None:
            self._pair.wait(work)
            self._pass_on(target)
        return index

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        self._generator = self._tensors()
        return self._generator

    def _tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        try:
            self._start()
            self._post_up_to(self.AHEAD, self._unpacker.target)
            while self._posted:
                index = self._wait_oldest()
                self._post_up_to(self.AHEAD, self._unpacker.target)  # they arrive while this one is consumed
                for item in self._unpacker.complete(index):
                    yield item
                    del item  # hold no view of a buffer the pool may want to refill
        except PairError as error:
            self._failed(error)
            raise TransferError(f"weight transfer failed: {error}") from error

    def _failed(self, error: PairError) -> None:
        self.failed = str(error)
        self.via_hop = self.via_hop or isinstance(error, HopError)
        if self._forward is not None:  # the successor cannot get the rest from us: let it fail now
            self._stop_forwarding(error)

    def finish(self) -> None:
        """Close the consumer's iterator and receive (and discard) every unit it did not take."""
        if self._generator is not None:
            self._generator.close()
        if self.failed is not None:
            return
        try:
            self._start()
            while self._posted:
                self._wait_oldest()
            while self._next < len(self._layout.units):
                self._post_up_to(1, self._unpacker.discard)
                self._wait_oldest()
            self._drain_forwards()
        except PairError as error:
            self._failed(error)
        finally:
            self._posted.clear()
            self._forwarding.clear()
            self._unpacker.release()
