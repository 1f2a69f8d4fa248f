"""Benchmark: rank 0's extra memory during a push from a sharded learner, streamed gather vs one whole copy.

Run on demand (not part of the tests):

    .venv/bin/python bench/streamed_gather.py [--model tiny|smollm2] [--chunk-mb 32]

Two FSDP2 ranks (gloo, spawned with the torchrun environment) hold the model; one rollout process (a
`WeightReceiver` that reads every tensor it is given) joins rank 0's `WeightSender`. Rank 0 then pushes
twice, measuring each push alone:
1. **streamed**: `sender.push(source)` with the learner's `GatheredWeights` source: every parameter is
   gathered when the push packs it and let go of afterwards (`drmas.learner.ranks.gathered`);
2. **whole copy** (what the learner did before): every parameter gathered into one list, then pushed.
Printed per push: the largest total of gathered bytes alive at once (counted by the source; for the copy,
the list's bytes), the rise of rank 0's resident memory above its level before the push (sampled every
millisecond from /proc/self/statm), and the push time. The streamed push runs first, so memory the
allocator kept from the copy cannot hide in its figure.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config.schema import TinyModelConfig  # noqa: E402
from drmas.models.loading import build_tiny_model, import_smollm2, load_model  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class RssPeak:
    """The highest resident memory above the level at entry, sampled every millisecond on a thread."""

    def __enter__(self) -> RssPeak:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def rise(self) -> int:
        return self.peak - self.base


def _receiver_main(endpoint: str) -> None:
    from drmas.config.weights import WeightSyncConfig
    from drmas.weights import WeightReceiver

    torch.set_num_threads(1)

    def apply(named, version: int, incarnation: str) -> None:
        for _, tensor in named:
            tensor.sum()  # read it, as an engine's load would

    WeightReceiver(endpoint, "bench", apply, config=WeightSyncConfig(timeout_s=120), background=True).start()
    while True:
        time.sleep(1)


def _rank_main(rank: int, size: int, port: int, model_dir: str, ports: tuple[int, int], chunk_mb: float,
               out: str) -> None:
    import torch.distributed as dist

    from drmas.config.schema import AlgorithmConfig, OptimConfig
    from drmas.config.weights import WeightSyncConfig
    from drmas.learner.policy import PolicyTrainer
    from drmas.learner.ranks.group import BatchFanout, follow
    from drmas.learner.ranks.sharding import ShardedRanks, init_ranks
    from drmas.weights import WeightSender

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    torch.set_num_threads(1)
    init_ranks("cpu")
    model, _ = load_model(Path(model_dir))
    trainer = PolicyTrainer("m", model, OptimConfig(), AlgorithmConfig(), ranks=ShardedRanks(torch.device("cpu")))
    del model
    fanout = BatchFanout(trainer.ranks)
    if rank:
        follow(trainer, fanout)
        dist.destroy_process_group()
        return
    source = trainer.weight_source(before_pass=fanout.gather)
    config = WeightSyncConfig(chunk_mb=chunk_mb, timeout_s=120, ready_timeout_s=120)
    lines = []
    with WeightSender("127.0.0.1", *ports, config=config, joins_in_thread=False) as sender:
        deadline = time.monotonic() + 300
        while "bench" not in sender.receivers():
            if time.monotonic() > deadline:
                raise TimeoutError("the rollout did not join")
            time.sleep(0.1)
        model_bytes = source.model_bytes()
        with RssPeak() as rss:
            start = time.perf_counter()
            report = sender.push(source, 1)
            seconds = time.perf_counter() - start
        assert report.receivers_ok == ["bench"], report
        lines.append(("streamed", source.peak_bytes, rss.rise, seconds))
        with RssPeak() as rss:
            start = time.perf_counter()
            fanout.gather()
            weights = list(trainer.named_tensors())
            report = sender.push(weights, 2)
            seconds = time.perf_counter() - start
        assert report.receivers_ok == ["bench"], report
        lines.append(("whole copy", sum(t.nbytes for _, t in weights), rss.rise, seconds))
        del weights
    fanout.finish()
    dist.destroy_process_group()
    Path(out).write_text(repr((model_bytes, lines)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--chunk-mb", type=float, default=32.0, help="pipeline.weights.chunk_mb")
    args = parser.parse_args()
    model_dir = import_smollm2() if args.model == "smollm2" else build_tiny_model(TinyModelConfig())
    ports = (_free_port(), _free_port())
    ctx = torch.multiprocessing.get_context("spawn")
    receiver = ctx.Process(target=_receiver_main, args=(f"tcp://127.0.0.1:{ports[0]}",), daemon=True)
    receiver.start()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        ranks = torch.multiprocessing.start_processes(
            _rank_main, args=(2, _free_port(), str(model_dir), ports, args.chunk_mb, out), nprocs=2, join=False,
            start_method="spawn")
        deadline = time.monotonic() + 1800
        try:
            while not ranks.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError("ranks still running after 30 min")
        finally:
            for proc in [*ranks.processes, receiver]:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        model_bytes, lines = eval(Path(out).read_text())  # noqa: S307 - our own repr of numbers and strings
    print(f"[{args.model}: {model_bytes / 1e6:.1f} MB of float32 weights, 2 FSDP2 ranks, chunk {args.chunk_mb:g} MB]")
    for name, gathered, rise, seconds in lines:
        print(f"{name:>10}: gathered bytes alive at most {gathered / 1e6:8.1f} MB ({gathered / model_bytes:5.1%} of "
              f"the model), rank 0 RSS rise {rise / 1e6:8.1f} MB, push {seconds:.2f} s")
    streamed, whole = lines
    print(f"streamed/whole gathered peak = {streamed[1] / whole[1]:.3f}, RSS rise = {streamed[2] / max(whole[2], 1):.3f}"
          f"  ({args.model})", flush=True)


if __name__ == "__main__":
    main()
