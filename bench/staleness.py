"""Trained samples per second of the asynchronous pipeline: a staleness bound vs strictly on-policy.

With `pipeline.max_staleness=0` rollouts may only generate for the learner's current version, so rollout
and learner take turns; with a bound of 2 they overlap. Both runs use the same config, seed and process
layout through `drmas run` (buffer, learner(s), rollout(s) as OS processes), one after the other in this
run. Throughput is measured from the learner's metrics between the end of its first step and the end of
its last, so process start-up and model loading are excluded; the ratio is bounded/on-policy.

    python bench/staleness.py --config configs/smoke.yaml --steps 12 [key=value ...]

Pin the thread count (default `trainer.threads=1`): on a small machine the gain comes from rollout and
learner using different cores at the same time.

Each learner's ceiling is the lower of two: its on-policy throughput with its waits removed (1 / (1 - idle)),
and what the machine's cores allow, the cores over the CPU seconds all the run's processes spent per trained
sample of that model on policy (sampled with psutil over the learner's measured span). The first alone
assumes that a learner trains as fast beside the rollouts as it did alone; where all the processes share a few
cores they cannot all be faster at once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from drmas.runtime.metrics import read_metrics


def cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by the process `root` and its live descendants."""
    import psutil

    total = 0.0
    try:
        procs = [psutil.Process(root)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def run(config: str, staleness: int, steps: int, overrides: list[str], out: Path) -> dict:
    """One `drmas run`; its learners' throughput over their measured span, and the CPU seconds the whole run used
    in that span (sampled every 0.2 s, interpolated at the span's ends)."""
    args = [sys.executable, "-m", "drmas.cli", "run", "--config", config, "pipeline.mode=async",
            f"pipeline.max_staleness={staleness}", f"trainer.steps={steps}", f"trainer.output_dir={out}",
            "eval.n_problems=0", "logging.tensorboard=false", "logging.console_every=0", "trainer.overwrite=true",
            *overrides]
    start = time.monotonic()
    cpu = []  # (wall clock, CPU seconds of the run's processes so far)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{out.name}.log", "w") as sink:
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            cpu.append((time.time(), cpu_seconds(proc.pid)))
            time.sleep(0.2)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"run with max_staleness={staleness} failed ({proc.returncode}): see {out.parent}/{out.name}.log")
    result = {"wall_s": wall, "models": {}}
    for metrics in sorted(out.glob("learner-*/metrics.jsonl")):
        records = read_metrics(metrics)
        model = metrics.parent.name.removeprefix("learner-")
        span = records[-1]["time"] - records[0]["time"]
        trained = sum(r[f"samples/{model}"] for r in records[1:])
        stale = [r[k] for r in records for k in r if k.startswith("staleness/") and k.endswith("/mean")]
        used = _at(cpu, records[-1]["time"]) - _at(cpu, records[0]["time"])
        result["models"][model] = {
            "steps": len(records), "samples_per_s": trained / span if span > 0 else float("nan"),
            "mean_staleness": sum(stale) / len(stale) if stale else 0.0,
            "idle": sum(r[f"idle/{model}"] for r in records[1:]) / max(len(records) - 1, 1),
            "cpu_s_per_sample": used / trained if trained else float("nan"),
        }
    return result


def _at(samples: list[tuple[float, float]], when: float) -> float:
    """The sampled series at time `when`, linearly between the samples around it."""
    import numpy as np

    times, values = zip(*samples)
    return float(np.interp(when, times, values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--bounded", type=int, default=2, help="the staleness bound compared with 0")
    parser.add_argument("--out", default="runs/bench_staleness")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = ["trainer.threads=1", *args.overrides]
    results = {}
    for staleness in (0, args.bounded):
        results[staleness] = run(args.config, staleness, args.steps, overrides, Path(args.out) / f"staleness_{staleness}")
    print(json.dumps(results, indent=1))
    base, bounded = results[0]["models"], results[args.bounded]["models"]
    print(f"\n{'model':<16}{'on-policy samples/s':>22}{f'bound {args.bounded} samples/s':>22}{'ratio':>8}"
          f"{'idle 0 -> bound':>18}{'ceiling: waits, cores':>23}{'of ceiling':>12}")
    cores = os.cpu_count() or 1
    for model in base:
        ratio = bounded[model]["samples_per_s"] / base[model]["samples_per_s"]
        # the on-policy run's waits removed; and no more CPU seconds a second than the machine has
        waits = 1.0 / max(1.0 - base[model]["idle"], 1e-9)
        machine = cores / base[model]["cpu_s_per_sample"] / base[model]["samples_per_s"]
        ceiling = min(waits, machine)
        print(f"{model:<16}{base[model]['samples_per_s']:>22.2f}{bounded[model]['samples_per_s']:>22.2f}"
              f"{ratio:>7.2f}x{base[model]['idle']:>10.2f} -> {bounded[model]['idle']:.2f}{waits:>14.2f}x, {machine:.2f}x"
              f"{ratio / ceiling:>11.0%}")


if __name__ == "__main__":
    main()
