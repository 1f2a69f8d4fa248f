"""The two transports of the weight channel, each kept small so the sender and receiver read as protocol only.

- `PairGroup`: a torch.distributed process group of the learner (rank 0) and one rollout's receiving ranks
  (rank 1 = the rollout process itself, or ranks 1..N = the N workers of an engine that receive in their
  workers, e.g. vLLM with tensor parallelism), built directly on the learner's TCPStore under a per-pair
  prefix, with no global world. One group per rollout makes join/leave trivial (nothing else is resized)
  and isolates failures: a dead rollout breaks only its own group, which is then thrown away.
- `Outbox`: lets several threads queue control messages for a ZeroMQ socket that one thread owns (ZeroMQ
  sockets are not thread-safe), waking that thread's poller at once.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.distributed as dist
import zmq

WILDCARD_HOSTS = ("", "0.0.0.0", "*", "::")


class PairError(RuntimeError):
    """A collective on a pair failed or timed out; the pair is unusable and must be rebuilt."""


def resolve_backend(name: str, tensors_on: torch.device | None = None) -> str:
    """'auto' -> 'nccl' when the weights are CUDA tensors and NCCL is usable, else 'gloo' (a CPU learner on a
    GPU machine sends CPU tensors: gloo); an explicit choice is checked."""
    nccl_ok = torch.cuda.is_available() and dist.is_nccl_available()
    if name == "auto":
        on_cuda = tensors_on is not None and tensors_on.type == "cuda"
        return "nccl" if nccl_ok and on_cuda else "gloo"
    if name == "nccl" and not nccl_ok:
        raise ValueError("backend 'nccl' needs CUDA and a torch build with NCCL")
    if name not in ("gloo", "nccl"):
        raise ValueError(f"unknown weight-sync backend {name!r} (auto, gloo, nccl)")
    return name


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (gloo must advertise one the peer can reach).

    A UDP connect sends nothing; it only makes the kernel pick the outgoing interface.
    """
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), 9))
            return probe.getsockname()[0]
    except OSError:
        return ""


_NCCL_ENV_LOCK = threading.Lock()


@contextmanager
def _nccl_error_handling_without_teardown() -> Iterator[None]:
    """Build NCCL groups whose errors/timeouts abort the communicator but never kill the process.

    ProcessGroupNCCL reads TORCH_NCCL_ASYNC_ERROR_HANDLING when it is constructed; the default tears the whole
    process down on a collective timeout, which would let a dead rollout kill the learner. Mode 2 (clean up
    only) raises in ``wait`` instead. The variable is restored at once so other groups keep their setting.
    """
    key = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
    with _NCCL_ENV_LOCK:
        previous = os.environ.get(key)
        os.environ[key] = "2"
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = previous


class PairGroup:
    """A process group used for broadcasts from rank 0 (the learner) to the ranks of one rollout."""

    def __init__(self, group: dist.ProcessGroup, backend: str, device: torch.device, timeout_s: float) -> None:
        self._group: dist.ProcessGroup | None = group
        self.backend = backend
        self.device = device
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls, store: dist.Store, pair_id: str, rank: int, backend: str, timeout_s: float, local_host: str = "",
        world_size: int = 2, device: torch.device | None = None,
    ) -> PairGroup:
        """Build the group (blocks until all ``world_size`` ranks do the same, or raises PairError after the
        timeout).

        ``device``: the CUDA device an NCCL pair lives on (the tensors' own: NCCL refuses two ranks on one
        GPU, so a learner on cuda:1 must not build its end on the current device, cuda:0 by default).

        ``local_host`` is the address gloo advertises to the peer ('' = gloo's default for this host).
        Ends with a one-element broadcast so both sides know the pair works before it is registered (NCCL
        would otherwise only connect at the first real broadcast).
        """
        timeout = datetime.timedelta(seconds=timeout_s)
        prefixed = dist.PrefixStore(f"drmas/weights/{pair_id}/", store)
        try:
            if backend == "gloo":
                options = dist.ProcessGroupGloo._Options()
                options._timeout = timeout
                gloo = dist.ProcessGroupGloo
                device = gloo.create_device(hostname=local_host) if local_host else gloo.create_default_device()
                options._devices = [device]
                group = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
                pair = cls(group, backend, torch.device("cpu"), timeout_s)
            elif backend == "nccl":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                options.is_high_priority_stream = False
                with _nccl_error_handling_without_teardown():
                    group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
                on = device if device is not None and device.type == "cuda" else torch.device("cuda")
                pair = cls(group, backend, torch.device("cuda", on.index if on.index is not None
                                                        else torch.cuda.current_device()), timeout_s)
            else:
                raise ValueError(f"unknown backend {backend!r}")
        except RuntimeError as error:  # torch.distributed errors (store, network, timeout) all derive from it
            raise PairError(f"building pair {pair_id} failed: {error}") from error
        probe = torch.zeros(1, dtype=torch.uint8, device=pair.device)
        try:
            pair.wait(pair.broadcast(probe))
        except PairError:
            pair.close()
            raise
        return pair

    def broadcast(self, tensor: torch.Tensor) -> dist.Work:
        """Start broadcasting ``tensor`` from rank 0 into the other ranks' ``tensor`` (same size on all)."""
        if self._group is None:
            raise PairError("pair is closed")
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.rootTensor = 0
        try:
            return self._group.broadcast([tensor], options)
        except RuntimeError as error:
            raise PairError(f"broadcast failed to start: {error}") from error

    def wait(self, work: dist.Work) -> None:
        """Block until ``work`` is done; PairError on failure or after ``timeout_s``.

        Gloo's own deadline (the group timeout) bounds ``wait``. An NCCL ``wait`` only orders CUDA streams, so
        its completion is polled against the deadline instead, and a late pair is aborted.
        """
        try:
            if self.backend == "nccl":
                deadline = time.monotonic() + self.timeout_s
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        self.close()
                        raise PairError(f"broadcast timed out after {self.timeout_s:g} s")
                    time.sleep(0.0005)
            work.wait()
        except RuntimeError as error:
            raise PairError(str(error).splitlines()[0]) from error

    def close(self) -> None:
        """Release the group. Gloo closes its sockets when the group is freed, so the peer fails fast instead
        of waiting for its timeout; NCCL needs an explicit abort to free its communicator."""
        group, self._group = self._group, None
        if group is not None and self.backend == "nccl":
            try:
                group.abort()
            except RuntimeError:
                pass

    @property
    def closed(self) -> bool:
        return self._group is None


class Outbox:
    """A thread-safe queue for a ZeroMQ socket owned by one thread, with a wake-up socket for its poller."""

    def __init__(self, context: zmq.Context) -> None:
        address = f"inproc://drmas-weights-outbox-{uuid.uuid4().hex}"
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = context.socket(zmq.PULL)  # the owner thread polls and drains this one
        self.wakeup.bind(address)
        self._notify = context.socket(zmq.PUSH)
        self._notify.connect(address)
        self._notify_lock = threading.Lock()

    def put(self, item: object) -> None:
        self._items.put(item)
        with self._notify_lock:
            if self._notify.closed:
                return
            try:
                self._notify.send(b"", zmq.NOBLOCK)
            except zmq.Again:  # the owner already has unread wake-ups; it will drain the queue anyway
                pass

    def drain(self) -> list[object]:
        """All queued items, in order (owner thread only)."""
        while True:
            try:
                self.wakeup.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        items = []
        while True:
            try:
                items.append(self._items.get_nowait())
            except queue.Empty:
                return items

    def close(self) -> None:
        with self._notify_lock:
            self._notify.close(linger=0)
        self.wakeup.close(linger=0)
