"""Benchmark (issue 37): what the learner process's heap setting costs one update, phase by phase.

Run on demand (not part of the tests; SmolLM2-135M, a few minutes on 2 cores, best on an idle machine):

    .venv/bin/python bench/update_heap.py [--reps 3] [--threads 1] [--samples 8]

The async learner's update was measured at 1.5x the colocated loop's update of the same batch. One of the
process settings in which they differ is the heap: a learner process maps every block of
`models.<id>.heap_mmap_threshold_kb` (1024) KiB or more on its own (`drmas.learner.heap`), so each large
tensor of every pass is a fresh mapping whose pages fault in; the colocated loop keeps glibc's default. Each
setting below runs in a fresh process (a heap setting holds for a process's life), builds the model's
`PolicyTrainer` as `drmas-learner` does, and takes `--reps` + 1 updates of the same samples (the first a
warm-up), each split into phases by hooks: the decoder's forward with gradients (log-prob recompute included),
`optimizer.step`, and the rest (backward with checkpointed layers recomputed, the loss, collation). Per
update: wall and CPU seconds, minor page faults, peak RSS.

Settings: glibc's default heap; the 1024 KiB threshold alone; the threshold with PyTorch's transparent huge
pages for tensors of 2 MiB or more (`models.<id>.huge_pages`; the learner's setting where jemalloc is missing);
the threshold with glibc's own huge-page tunable for its mapped blocks (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`,
glibc >= 2.35); glibc's default heap with PyTorch's huge pages; jemalloc preloaded (`models.<id>.allocator`),
without and with huge pages (the learner's default). Huge pages need the kernel's THP mode `madvise` or
`always`; jemalloc needs libjemalloc2 (`make jemalloc`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.config import read_config  # noqa: E402
from drmas.core.sample import Sample  # noqa: E402
from drmas.learner.allocator import jemalloc_library  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
JEMALLOC = {"LD_PRELOAD": jemalloc_library() or "libjemalloc.so.2"}  # as drmas-learner preloads it
SETTINGS = {  # name: (heap_mmap_threshold_kb, huge_pages, extra environment)
    "glibc default": (0, False, {}),
    "threshold 1024 KiB": (1024, False, {}),
    "threshold + THP (glibc fallback)": (1024, True, {}),
    "threshold + glibc hugetlb": (1024, False, {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}),
    "glibc default + THP": (0, True, {}),
    "jemalloc": (0, False, JEMALLOC),
    "jemalloc + THP (learner)": (0, True, JEMALLOC),
}


def samples(n: int) -> list[Sample]:
    """`n` x (200 prompt + 80 response) tokens, the quick start's size."""
    rng = np.random.default_rng(0)
    return [Sample(episode_id=f"e{i}", group_id="g", agent="solver", model="m", turn=0,
                   prompt_ids=rng.integers(100, 40000, 200).tolist(), response_ids=rng.integers(100, 40000, 80).tolist(),
                   behaviour_logprobs=np.full(80, -3.0, dtype=np.float32), policy_version=0, temperature=1.0,
                   valid=True, reward=float(i % 2)) for i in range(n)]


class Phases:
    """Seconds spent in the decoder's forward and in `optimizer.step`, by hooks."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.seconds = {"forward": 0.0, "optimizer": 0.0}
        self._start: dict[str, float] = {}
        decoder = model.get_decoder()  # the LM head is fused with the log-softmax (drmas.engines.fused_head)
        decoder.register_forward_pre_hook(lambda *_: self._begin("forward"))
        decoder.register_forward_hook(lambda *_: self._end("forward"))
        optimizer.register_step_pre_hook(lambda *_: self._begin("optimizer"))
        optimizer.register_step_post_hook(lambda *_: self._end("optimizer"))

    def _begin(self, phase: str) -> None:
        self._start[phase] = time.perf_counter()

    def _end(self, phase: str) -> None:
        self.seconds[phase] += time.perf_counter() - self._start.pop(phase)

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {k: 0.0 for k in self.seconds}
        return out


def child(setting: str, reps: int, n_samples: int) -> None:
    """One setting in this fresh process: print one JSON line of per-update figures."""
    from drmas.learner.heap import advise_huge_pages
    from drmas.learner.trainers import trained_policy

    threshold, huge_pages, _ = SETTINGS[setting]
    cfg = read_config(ROOT / "configs" / "quickstart.yaml",
                      [f"models.smollm2.heap_mmap_threshold_kb={threshold}", f"models.smollm2.huge_pages={huge_pages}",
                       f"algorithm.micro_batch_size={n_samples}"])
    advise_huge_pages(huge_pages)  # as drmas-learner does at its start, before any tensor
    (model_id,) = [m for m in cfg.models]
    trainer, _ = trained_policy(cfg, model_id, None, torch.device("cpu"))
    phases = Phases(trainer.model, trainer.optimizer)
    batch, adv = samples(n_samples), np.array([1.0, -1.0] * (n_samples // 2))
    updates = []
    for rep in range(reps + 1):
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        trainer.update(batch, adv)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        split = phases.take()
        if rep:
            updates.append({"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                            "minor_faults": after.ru_minflt - before.ru_minflt, **split,
                            "rest_s": wall - split["forward"] - split["optimizer"]})
    print(json.dumps({"updates": updates, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def run_child(setting: str, reps: int, n_samples: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), **SETTINGS[setting][2]}
    done = subprocess.run([sys.executable, __file__, "--child", setting, "--reps", str(reps), "--samples",
                           str(n_samples), "--threads", str(threads)], capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{setting}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", nargs="+", choices=sorted(SETTINGS), help="these settings (default: all); the first is the baseline")
    parser.add_argument("--child", choices=sorted(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.child:
        child(args.child, args.reps, args.samples)
        return
    print(f"SmolLM2-135M full model, {args.samples} x 280 tokens, {args.threads} thread(s), load "
          f"{os.getloadavg()[0]:.1f}; median of {args.reps} updates after a warm-up", flush=True)
    base = None
    for setting in args.only or SETTINGS:
        out = run_child(setting, args.reps, args.samples, args.threads)
        med = {k: statistics.median(u[k] for u in out["updates"]) for k in out["updates"][0]}
        base = base or med
        print(f"{setting:30s} wall {med['wall_s']:6.2f} s ({med['wall_s'] / base['wall_s']:.2f}x)  cpu {med['cpu_s']:6.2f} s  "
              f"forward {med['forward']:5.2f}  optimizer {med['optimizer']:5.2f}  rest {med['rest_s']:5.2f} s  "
              f"minor faults {med['minor_faults']:9.0f}  peak RSS {out['peak_rss_mb']:6.0f} MB  "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
