"""Benchmark: bytes the learner process sends per weight push to 1, 2 and 4 rollouts, and the push time,
over the old path (one pair per rollout: ``weights.fanout=pairs``) and the relay chain (``chain``).

Run on demand (not part of the tests):

    .venv/bin/python bench/fanout.py [--mb 64] [--chunk-mb 4] [--reps 3]

What is measured and how: the learner (a `WeightSender`) runs in this process, every rollout (a
`WeightReceiver` whose apply callback copies each tensor into preallocated parameters, as an engine's
``load_weights`` does) in a process of its own on 127.0.0.1. "Learner bytes" is the growth of this process's
``wchar`` in ``/proc/self/io`` across one push: every byte passed to write-family syscalls, gloo's socket
writes included (the control messages and logging add a few KB). It is divided by the payload, so 1.00x
means each byte left the learner once. The push time is `PushReport.seconds` (Manifest to the last Ack).
Both paths run in the same run on the same rollout processes, alternating push by push, so both see the
same background load; medians over ``--reps`` pushes per point.

First it measures what a plain gloo broadcast over one group of the learner and n receivers makes its root
send (the design question behind the relay chain: gloo broadcasts down a binomial tree).
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import queue
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.weights import WeightReceiver, WeightSender  # noqa: E402

ROLLOUTS = (1, 2, 4)


def written_bytes() -> int:
    """This process's wchar: bytes passed to write-family syscalls (sockets included), all threads."""
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("wchar:"))


def model_like(mb: float, seed: int = 0) -> list[tuple[str, torch.Tensor]]:
    """fp32 tensors of a small decoder's shapes (an embedding, then 1 MiB matrices and norms) summing to ~mb."""
    g = torch.Generator().manual_seed(seed)
    named = [("embed.weight", torch.randn(4096, 256, generator=g))]  # 4 MiB
    left, index = int(mb * (1 << 20)) - 4 * (1 << 20), 0
    while left > 0:
        named.append((f"layers.{index}.proj.weight", torch.randn(512, 512, generator=g)))
        named.append((f"layers.{index}.norm.weight", torch.randn(512, generator=g)))
        left -= (512 * 512 + 512) * 4
        index += 1
    return named


def _gloo_group(store: dist.Store, prefix: str, rank: int, size: int) -> dist.ProcessGroup:
    options = dist.ProcessGroupGloo._Options()
    options._timeout = datetime.timedelta(seconds=300)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, size, options)


def _broadcast_once(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    """Barrier, one broadcast from rank 0, barrier (every rank calls it)."""
    group.allreduce([torch.zeros(1)]).wait()
    group.broadcast([tensor], dist.BroadcastOptions()).wait()
    group.allreduce([torch.zeros(1)]).wait()


def _rollout(rid: str, commands: mp.Queue, applied: mp.Queue, mb: float) -> None:
    """One rollout process: joins or leaves the learner, or takes part in a raw broadcast, on command."""
    torch.set_num_threads(1)
    params = {name: torch.zeros_like(t) for name, t in model_like(mb)}
    receiver: WeightReceiver | None = None

    def load_weights(named, version: int, incarnation: str) -> None:
        for name, tensor in named:
            params[name].copy_(tensor)
        applied.put((rid, version))

    while True:
        command, *args = commands.get()
        if command == "join" and receiver is None:
            receiver = WeightReceiver(args[0], rid, load_weights, background=True,
                                      config=WeightSyncConfig(timeout_s=120, join_retry_s=0.2)).start()
        elif command == "leave" and receiver is not None:
            receiver.close()
            receiver = None
        elif command == "broadcast":
            store_port, rank, size, nbytes = args
            store = dist.TCPStore("127.0.0.1", store_port, None, False, datetime.timedelta(seconds=60))
            _broadcast_once(_gloo_group(store, f"raw{size}/", rank, size), torch.zeros(nbytes, dtype=torch.uint8))
            applied.put((rid, "broadcast"))
        elif command == "exit":
            return


class Rollouts:
    """The rollout processes, always killed at the end."""

    def __init__(self, n: int, mb: float) -> None:
        ctx = mp.get_context("spawn")
        self.applied: mp.Queue = ctx.Queue()
        self.ids = [f"r{i}" for i in range(n)]
        self.commands = {rid: ctx.Queue() for rid in self.ids}
        self.procs = [ctx.Process(target=_rollout, args=(rid, self.commands[rid], self.applied, mb), daemon=True)
                      for rid in self.ids]
        for proc in self.procs:
            proc.start()

    def send(self, rids: list[str], *command: object) -> None:
        for rid in rids:
            self.commands[rid].put(command)

    def wait(self, expected: set[tuple[str, object]], timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while expected:
            try:
                expected.discard(self.applied.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                raise RuntimeError(f"rollouts did not report {sorted(expected)}") from None

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.join(5)


def raw_broadcast(rollouts: Rollouts, nbytes: int) -> dict[int, float]:
    """n -> bytes the root of one gloo broadcast to n receivers wrote, over the payload."""
    ratios = {}
    for n in ROLLOUTS:
        store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=60), wait_for_workers=False)
        members = rollouts.ids[:n]
        for rank, rid in enumerate(members, start=1):
            rollouts.send([rid], "broadcast", store.port, rank, n + 1, nbytes)
        group = _gloo_group(store, f"raw{n + 1}/", 0, n + 1)
        before = written_bytes()
        _broadcast_once(group, torch.ones(nbytes, dtype=torch.uint8))
        ratios[n] = (written_bytes() - before) / nbytes
        rollouts.wait({(rid, "broadcast") for rid in members})
    return ratios


def pushes(rollouts: Rollouts, mb: float, chunk_mb: float, reps: int) -> dict[tuple[str, int], list[tuple[float, float]]]:
    """(fanout, n) -> [(learner bytes / payload, push seconds)] per push."""
    weights = model_like(mb, seed=1)
    version = 0
    config = WeightSyncConfig(chunk_mb=chunk_mb, timeout_s=120, ready_timeout_s=120, backend="gloo")
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with WeightSender("127.0.0.1", config=config, current_weights=lambda: (version, weights)) as sender:
        for n in ROLLOUTS:
            members = rollouts.ids[:n]
            rollouts.send(members, "join", sender.endpoint)
            rollouts.send(rollouts.ids[n:], "leave")
            deadline = time.monotonic() + 300
            while sorted(sender.receivers()) != members or None in sender.receivers().values():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rollouts {members} did not join: {sender.receivers()}")
                time.sleep(0.05)
            while not rollouts.applied.empty():  # the join syncs' reports
                rollouts.applied.get()
            for rep in range(reps + 1):  # the first round warms both paths up (hops built, pages touched)
                for fanout in ("pairs", "chain"):
                    config.fanout = fanout  # the transfer reads it per push
                    version += 1
                    before = written_bytes()
                    report = sender.push(weights, version)
                    written = written_bytes() - before
                    if report.receivers_ok != members:
                        raise RuntimeError(f"push to {members} failed: {report}")
                    rollouts.wait({(rid, version) for rid in members})
                    if rep:
                        results.setdefault((fanout, n), []).append((written / report.bytes, report.seconds))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=64.0, help="MiB of fp32 weights per push")
    parser.add_argument("--chunk-mb", type=float, default=4.0, help="unit size (weights.chunk_mb)")
    parser.add_argument("--reps", type=int, default=3, help="timed pushes per path and rollout count")
    args = parser.parse_args()
    payload = sum(t.numel() * t.element_size() for _, t in model_like(args.mb))
    print(f"payload {payload / 1e6:.1f} MB in {args.chunk_mb:g} MiB units, {args.reps} pushes per point, "
          f"learner bytes = growth of /proc/self/io wchar of the learner process over one push")
    rollouts = Rollouts(max(ROLLOUTS), args.mb)
    try:
        raw = raw_broadcast(rollouts, payload)
        print("one gloo broadcast group (learner + n): root wrote " +
              ", ".join(f"{raw[n]:.2f}x to {n}" for n in ROLLOUTS) + " (binomial tree)")
        results = pushes(rollouts, args.mb, args.chunk_mb, args.reps)
    finally:
        rollouts.close()
    print(f"{'rollouts':>8} | {'pairs: bytes':>12} {'time s':>7} | {'chain: bytes':>12} {'time s':>7}")
    for n in ROLLOUTS:
        cells = []
        for fanout in ("pairs", "chain"):
            runs = results[(fanout, n)]
            cells.append(f"{statistics.median(r[0] for r in runs):11.2f}x {statistics.median(r[1] for r in runs):7.2f}")
        print(f"{n:>8} | {cells[0]} | {cells[1]}")


if __name__ == "__main__":
    main()
