"""Real learner/rollout processes for the weight-channel tests (`test_weight_sync`, `test_weight_fanout`).

The learner (`WeightSender`) runs in the test process (or in a child where it must be killed) and every
rollout (`WeightReceiver`) in its own spawned process on 127.0.0.1 with OS-chosen ports. Rollouts report a
digest of every tensor they were given, so "identical to the sender's" is checked bit for bit. Children
are SIGKILLed in ``finally`` whatever happens.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest
import torch

from drmas.config.weights import WeightSyncConfig
from drmas.weights import PushReport, WeightReceiver, WeightSender

# Fast detection of a silent peer (heartbeats), so the tests that kill one stay short, with slack for a loaded
# 2-core machine (a starved process must not look dead). The deadlines of a transfer and of a rollout getting
# ready are long: a killed peer's sockets close at once, so no passing test waits for them, and a slow machine
# must not run them out.
CFG = dict(timeout_s=20.0, ready_timeout_s=30.0, join_retry_s=0.2, heartbeat_s=0.25, peer_timeout_s=3.0)


def digest(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha1(data + str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode()).hexdigest()


def digests(named: dict[str, torch.Tensor]) -> dict[str, str]:
    return {name: digest(t) for name, t in named.items()}


def make_weights(seed: int, big_mb: float = 0.0, layers: int = 0) -> dict[str, torch.Tensor]:
    """A small model-like set of tensors: mixed dtypes, a tied pair, an empty tensor, a scalar; optionally
    one ``big_mb`` tensor and ``layers`` extra 256 KiB tensors."""
    g = torch.Generator().manual_seed(seed)
    weights = {
        "embed.weight": torch.randn(256, 64, generator=g),
        "layer.0.q.weight": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "layer.0.norm.weight": torch.randn(64, generator=g).to(torch.float16),
        "layer.0.step": torch.tensor(seed, dtype=torch.int64),
        "layer.0.mask": torch.rand(33, generator=g) > 0.5,
        "empty": torch.empty(0, 8),
    }
    weights["lm_head.weight"] = weights["embed.weight"]  # tied
    if big_mb:
        weights["big.weight"] = torch.randn(int(big_mb * (1 << 20) / 4), generator=g)
    for layer in range(layers):
        weights[f"extra.{layer}.weight"] = torch.randn(256, 256, generator=g)
    return weights




STARTED = -2  # a slow rollout reports this "version" once it has taken the first tensor of a push


def _receiver_main(
    endpoint: str, rid: str, results: mp.Queue, poll_mode: bool, slow_s: float, fail_names: tuple
) -> None:
    """A rollout process: reports (rid, version, {name: digest}) for every applied update."""
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {rid} %(message)s")  # shown with pytest -s

    def apply(named, version: int, incarnation: str) -> None:
        seen = {}
        for name, tensor in named:
            if name in fail_names:
                raise KeyError(f"unknown weight {name}")
            seen[name] = digest(tensor)  # consume now: the tensor is only valid until the next one
            if slow_s:
                if len(seen) == 1:  # the first tensor is in: the transfer is under way
                    results.put((rid, STARTED, {}))
                time.sleep(slow_s)
        results.put((rid, version, seen))

    receiver = WeightReceiver(endpoint, rid, apply, config=WeightSyncConfig(**CFG),
                              background=not poll_mode).start()
    while True:  # the parent kills us
        if poll_mode:
            try:
                receiver.poll()  # the rollout loop: one "generation step", then apply what arrived
            except KeyError as error:
                results.put((rid, -1, {"error": str(error)}))
            time.sleep(0.02)
        else:
            time.sleep(1.0)


def _sender_main(control_port: int, store_port: int, seed: int, version: int, layers: int, info: mp.Queue) -> None:
    """A learner process serving make_weights(seed, layers=layers) as ``version`` to whoever joins."""
    torch.set_num_threads(1)
    weights = make_weights(seed, layers=layers)
    sender = WeightSender("127.0.0.1", control_port, store_port, config=WeightSyncConfig(chunk_mb=0.25, **CFG),
                          current_weights=lambda: (version, list(weights.items()))).start()
    info.put((sender.endpoint, int(sender.endpoint.rsplit(":", 1)[1]), sender.store_port))
    while True:
        time.sleep(1.0)


class Cluster:
    """Spawns and always kills the child processes of one test.

    Every child reports on a queue of its own: a process killed while writing to a shared queue would
    leave that queue's lock held and silence everyone else.
    """

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.children: dict[str, mp.Process] = {}
        self.queues: dict[str, mp.Queue] = {}

    def receiver(self, endpoint: str, rid: str, poll_mode: bool = False, slow_s: float = 0.0,
                 fail_names: tuple = ()) -> mp.Process:
        results = self.queues[rid] = self.ctx.Queue()
        proc = self.ctx.Process(target=_receiver_main, args=(endpoint, rid, results, poll_mode, slow_s, fail_names),
                                name=rid, daemon=True)
        proc.start()
        self.children[rid] = proc
        return proc

    def sender_process(
        self, control_port: int, store_port: int, seed: int, version: int, layers: int = 0
    ) -> tuple[str, int, int]:
        info = self.ctx.Queue()
        proc = self.ctx.Process(target=_sender_main, args=(control_port, store_port, seed, version, layers, info),
                                name="sender", daemon=True)
        proc.start()
        self.children["sender"] = proc
        return info.get(timeout=30)

    def kill(self, name: str) -> None:
        proc = self.children.pop(name)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(5)

    def kill_once_started(self, name: str, timeout: float = 60.0) -> threading.Thread:
        """Kill slow rollout ``name`` as soon as it reports the first tensor of a push (STARTED): in the middle of
        its transfer, however fast or slow the machine (a timer could fire before the transfer began, or after
        it ended). Join the returned thread after the push."""
        killer = threading.Thread(target=lambda: (self.wait_for({name: STARTED}, timeout), self.kill(name)),
                                  name=f"kill-{name}", daemon=True)
        killer.start()
        return killer

    def kill_all(self) -> None:
        for name in list(self.children):
            self.kill(name)

    def wait_for(self, expected: dict[str, int], timeout: float = 30.0) -> dict[str, dict[str, str]]:
        """Collect reports until every rid in ``expected`` has reported that version; returns their digests."""
        got: dict[str, dict[str, str]] = {}
        deadline = time.monotonic() + timeout
        for rid, version in expected.items():
            while rid not in got:
                try:
                    _, reported, seen = self.queues[rid].get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    pytest.fail(f"timed out waiting for {expected}; got versions for {sorted(got)}")
                if reported == version:
                    got[rid] = seen
        return got


@contextmanager
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        yield c
    finally:
        c.kill_all()


class Learner:
    """A learner in the test process: a WeightSender plus the weights it currently serves to joiners."""

    def __init__(self, weights: dict[str, torch.Tensor], version: int, chunk_mb: float, **ports: int) -> None:
        self.weights, self.version = weights, version
        self.sender = WeightSender("127.0.0.1", config=WeightSyncConfig(chunk_mb=chunk_mb, **CFG),
                                   current_weights=self.current, **ports)

    def current(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        return self.version, list(self.weights.items())

    @property
    def endpoint(self) -> str:
        return self.sender.endpoint

    def push(self, weights: dict[str, torch.Tensor], version: int) -> PushReport:
        """What a learner loop does after an update: switch what joiners get and push, both under exclusive()."""
        with self.sender.exclusive():
            self.weights, self.version = weights, version
            return self.sender.push(list(weights.items()), version)

    def wait_acked(self, expected: dict[str, int], timeout: float = 10.0) -> None:
        """Until the learner holds every Ack (a rollout reports before it acks: kill only after this)."""
        deadline = time.monotonic() + timeout
        while self.sender.receivers() != expected:
            assert time.monotonic() < deadline, f"acks: {self.sender.receivers()} != {expected}"
            time.sleep(0.02)


@contextmanager
def learner(
    weights: dict[str, torch.Tensor], version: int, chunk_mb: float = 0.01, **ports: int
) -> Iterator[Learner]:
    learn = Learner(weights, version, chunk_mb, **ports)
    learn.sender.start()
    try:
        yield learn
    finally:
        learn.sender.close()
