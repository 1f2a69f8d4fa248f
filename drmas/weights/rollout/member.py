"""The receiving end of a pair, wherever it lives: the rollout process itself (rank 1), or an engine's workers
taking the broadcasts themselves (ranks 1..N).

With vLLM on GPUs (and with tensor parallelism anywhere) the weights must end up in the engine's worker
processes, each holding its shard. Receiving them in the rollout process and handing them on would cross a
process boundary per tensor; instead every worker joins the learner's pair group as a rank of its own
(ranks 1..N; the learner is rank 0), receives each broadcast unit on its own device (NCCL straight into GPU
memory when the learner sends CUDA tensors) and loads the full tensors, from which the engine's loader cuts
that worker's shard. The rollout process keeps the control side (join, heartbeats, Ready/Applied) and only asks
its engine to connect, receive and close, always from the thread that drives the engine.

`PairSpec` says how to build a receiving end of a pair (the rollout hands it to its workers); `PairMember`
is one receiving rank's end, used by the rollout process and by each worker alike. An engine offers
worker-side receiving by implementing `WorkerReceivers`.
"""

from __future__ import annotations

import datetime
from typing import Callable, Protocol, runtime_checkable

import msgspec
import torch.distributed as dist

from drmas.weights import messages as msg
from drmas.weights.chunks import BufferPool, Layout
from drmas.weights.relay import Hops
from drmas.weights.rollout.stream import ReceiveStream
from drmas.weights.transport import PairGroup, local_address_towards


class PairSpec(msgspec.Struct, frozen=True):
    """Where and how the receiving ranks of one pair build their end of its group."""

    pair_id: str
    store_host: str
    store_port: int
    backend: str  # 'gloo' or 'nccl', as the learner chose
    timeout_s: float
    world_size: int  # 1 (the learner) + the receiving ranks


@runtime_checkable
class WorkerReceivers(Protocol):
    """An engine whose workers can receive a pair's broadcasts themselves (see the module docstring).

    All methods are called from the thread that drives the engine, never while it generates.
    """

    def weight_ranks(self) -> int:
        """How many receiving ranks the engine brings; 0 = none (the rollout process receives and calls
        ``load_weights``)."""
        ...

    def connect_weights(self, spec: PairSpec) -> None:
        """Every worker builds its end of the pair group (ranks 1..weight_ranks()); raises on failure."""
        ...

    def receive_weights(self, pair_id: str, layout: Layout, version: int, incarnation: str) -> None:
        """Every worker receives the update laid out as ``layout`` and loads it; then later responses carry
        ``version`` and ``incarnation``. Raises if any worker failed (the pair must then be rebuilt)."""
        ...

    def close_weights(self, pair_id: str) -> None:
        """Every worker releases its end of the pair (no error if it has none)."""
        ...


def receiving_workers(engine: object) -> WorkerReceivers | None:
    """``engine`` when its workers receive the weights themselves, else None."""
    if isinstance(engine, WorkerReceivers) and engine.weight_ranks() > 0:
        return engine
    return None


class PairMember:
    """One receiving rank's end of a pair group, with receive buffers kept across updates."""

    def __init__(self, spec: PairSpec, rank: int) -> None:
        """Connect to the learner's store and build the group as ``rank`` (blocks until all ranks joined;
        `PairError` after the spec's timeout)."""
        if not 1 <= rank < spec.world_size:
            raise ValueError(f"receiving rank {rank} outside 1..{spec.world_size - 1} of pair {spec.pair_id}")
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        self.spec = spec
        self._store = dist.TCPStore(spec.store_host, spec.store_port, None, False, timeout)
        self.pair = PairGroup.connect(self._store, spec.pair_id, rank, spec.backend, spec.timeout_s,
                                      local_address_towards(spec.store_host), world_size=spec.world_size)
        self._pool: BufferPool | None = None
        self.hops = Hops(self._store, spec.store_host, spec.backend, spec.timeout_s)

    def stream(self, layout: Layout, on_start: Callable[[], msg.Route | None] = lambda: None,
               broken: Callable[[], str | None] = lambda: None) -> ReceiveStream:
        """A stream over the next update: iterate its ``tensors()`` into the model, then call ``finish()``.

        ``on_start`` runs just before the first receive (as in `ReceiveStream`); it may return the learner's
        `Route` for this update, whose hops are then built or reused (see ``relay.py``). ``broken`` as in
        `ReceiveStream`."""
        self._pool = ReceiveStream.pool_for(layout, self.pair.device, self._pool)

        def start():
            route = on_start()
            return None if route is None else self.hops.path(route, self.pair)

        return ReceiveStream(self.pair, layout, self._pool, on_start=start, broken=broken)

    def close(self) -> None:
        self.hops.close()
        self.pair.close()
        self._store = None
        self._pool = None
