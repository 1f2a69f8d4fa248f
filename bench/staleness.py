"""Trained groups per second of the asynchronous pipeline: a staleness bound vs strictly on-policy.

With `pipeline.max_staleness=0` rollouts may only generate for the learner's current version, so rollout
and learner take turns; with a bound of 2 they overlap. Both runs use the same config, seed and process
layout through `drmas run` (buffer, learner(s), rollout(s) as OS processes), one after the other in this
run (`--reps N`: N such pairs, alternating). Throughput is measured from the learner's metrics between the end
of its first step and the end of its last, so process start-up and model loading are excluded; the ratio is
bounded/on-policy.

    python bench/staleness.py --config configs/smoke.yaml --steps 12 [key=value ...]

Pin the thread count (default `trainer.threads=1`): on a small machine the gain comes from rollout and
learner using different cores at the same time.

The unit is the learner's step (`rollout.prompts_per_step` whole groups), not the sample: how many calls an
episode makes (a rejected answer is tried again) and how long they are depend on the policy, and with tiny
models the policy changes within a few steps, differently in every run. So by default every trained model's
learning rate is 0 (`--learn` trains as configured): each run generates, trains (forward, backward, the
optimizer's step) and pushes as it would, on the same distribution of work from first step to last. Measured
on smoke_async, 40 steps: solver tokens per step ranged 100-175 from run to run while learning.

Each learner's ceiling is the lower of two: its on-policy throughput with its waits removed (1 / (1 - idle)),
and what the machine's cores allow, the cores over the CPU seconds all the run's processes spent per trained
step of that model on policy (sampled with psutil over the learner's measured span). The first alone
assumes that a learner trains as fast beside the rollouts as it did alone; where all the processes share a few
cores they cannot all be faster at once. The last table says where the cores went, process by process.
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


def cpu_seconds(root: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by the process `root` and its live descendants, by process: a
    pipeline process by its module and its `--model` / `--index` (`learner X`, `rollout 0`, `buffer`), every
    other one (the launcher itself, torchrun) as `other`."""
    import psutil

    used: dict[str, float] = {}
    try:
        procs = [psutil.Process(root)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return used
    for proc in procs:
        try:
            times = proc.cpu_times()
            label = process_label(proc.cmdline())
        except psutil.Error:
            continue
        used[label] = used.get(label, 0.0) + times.user + times.system
    return used


def process_label(cmdline: list[str]) -> str:
    """`learner <model>`, `rollout <index>`, `buffer` or `other` for a process of a `drmas run`."""
    if "-m" not in cmdline:
        return "other"
    module = cmdline[cmdline.index("-m") + 1]
    role = module.split(".")[1] if module.startswith("drmas.") and module.count(".") >= 1 else ""
    if role not in ("learner", "rollout", "buffer"):
        return "other"
    for flag in ("--model", "--index"):
        if flag in cmdline[:-1]:
            return f"{role} {cmdline[cmdline.index(flag) + 1]}"
    return role


def run(config: str, staleness: int, steps: int, overrides: list[str], out: Path) -> dict:
    """One `drmas run`; its learners' throughput over their measured span, and the CPU seconds the whole run used
    in that span (sampled every 0.2 s, interpolated at the span's ends)."""
    args = [sys.executable, "-m", "drmas.cli", "run", "--config", config, "pipeline.mode=async",
            f"pipeline.max_staleness={staleness}", f"trainer.steps={steps}", f"trainer.output_dir={out}",
            "eval.n_problems=0", "logging.tensorboard=false", "logging.console_every=0", "trainer.overwrite=true",
            *overrides]
    start = time.monotonic()
    cpu = []  # (wall clock, CPU seconds of each of the run's processes so far)
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
    labels = sorted({label for _, used in cpu for label in used})
    for metrics in sorted(out.glob("learner-*/metrics.jsonl")):
        records = read_metrics(metrics)
        model = metrics.parent.name.removeprefix("learner-")
        span = records[-1]["time"] - records[0]["time"]
        trained = sum(r[f"samples/{model}"] for r in records[1:])
        steps = len(records) - 1
        stale = [r[k] for r in records for k in r if k.startswith("staleness/") and k.endswith("/mean")]
        first, last = records[0]["time"], records[-1]["time"]
        by_process = {label: (_at(cpu, label, last) - _at(cpu, label, first)) / span if span > 0 else float("nan")
                      for label in labels}
        used = sum(by_process.values()) * span
        result["models"][model] = {
            "steps": len(records), "steps_per_s": steps / span if span > 0 else float("nan"),
            "samples_per_s": trained / span if span > 0 else float("nan"),
            "mean_staleness": sum(stale) / len(stale) if stale else 0.0,
            "idle": sum(r[f"idle/{model}"] for r in records[1:]) / max(len(records) - 1, 1),
            "cpu_s_per_step": used / steps if steps else float("nan"),
            "cores_used": {"all": sum(by_process.values()), **by_process},
        }
    return result


def _at(samples: list[tuple[float, dict[str, float]]], label: str, when: float) -> float:
    """The CPU seconds of process `label` at time `when`, linearly between the samples around it (0 before it
    started)."""
    import numpy as np

    times = [t for t, _ in samples]
    return float(np.interp(when, times, [used.get(label, 0.0) for _, used in samples]))


def frozen(config: str, overrides: list[str]) -> list[str]:
    """Overrides that set every trained model's learning rate (an adapter's own `optim`, else its model's) to 0."""
    from drmas.config.derived import split_model, trained_models
    from drmas.config.load import read_config

    cfg = read_config(config, overrides)
    keys = []
    for model_id in trained_models(cfg):
        base, adapter = split_model(model_id)
        own = adapter is not None and cfg.models[base].adapters[adapter].optim is not None
        keys.append(f"models.{base}.adapters.{adapter}.optim.lr=0" if own else f"models.{base}.optim.lr=0")
    return list(dict.fromkeys(keys))


def report(base: dict, bounded: dict, bound: int) -> dict[str, float]:
    """Print one pair's tables; returns each model's share of its ceiling."""
    print(f"\n{'model':<16}{'on-policy steps/s':>20}{f'bound {bound} steps/s':>20}{'ratio':>8}"
          f"{'idle 0 -> bound':>18}{'ceiling: waits, cores':>23}{'of ceiling':>12}")
    cores = os.cpu_count() or 1
    shares = {}
    for model in base:
        ratio = bounded[model]["steps_per_s"] / base[model]["steps_per_s"]
        # the on-policy run's waits removed; and no more CPU seconds a second than the machine has
        waits = 1.0 / max(1.0 - base[model]["idle"], 1e-9)
        machine = cores / base[model]["cpu_s_per_step"] / base[model]["steps_per_s"]
        shares[model] = ratio / min(waits, machine)
        print(f"{model:<16}{base[model]['steps_per_s']:>20.2f}{bounded[model]['steps_per_s']:>20.2f}"
              f"{ratio:>7.2f}x{base[model]['idle']:>10.2f} -> {bounded[model]['idle']:.2f}{waits:>14.2f}x, {machine:.2f}x"
              f"{shares[model]:>11.0%}")
    # where the cores went over each learner's measured span: what the bound did not turn into work was idle
    print(f"\n{'cores used over the span of':<28}" + "".join(f"{m + ', 0 -> ' + str(bound):>30}" for m in base))
    for label in base[next(iter(base))]["cores_used"]:
        print(f"{label:<28}" + "".join(f"{base[m]['cores_used'].get(label, 0.0):>22.2f} -> "
                                      f"{bounded[m]['cores_used'].get(label, 0.0):.2f}" for m in base))
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--bounded", type=int, default=2, help="the staleness bound compared with 0")
    parser.add_argument("--reps", type=int, default=1, help="pairs of runs (on-policy, bounded), alternating")
    parser.add_argument("--learn", action="store_true", help="train at the configured learning rates (default: 0)")
    parser.add_argument("--out", default="runs/bench_staleness")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = ["trainer.threads=1", *args.overrides]
    if not args.learn:
        overrides += frozen(args.config, overrides)
    pairs, shares = [], []
    for rep in range(args.reps):
        out = Path(args.out) / f"rep_{rep}" if args.reps > 1 else Path(args.out)
        pairs.append({s: run(args.config, s, args.steps, overrides, out / f"staleness_{s}") for s in (0, args.bounded)})
    print(json.dumps(pairs, indent=1))
    for pair in pairs:
        shares.append(report(pair[0]["models"], pair[args.bounded]["models"], args.bounded))
    if len(shares) > 1:
        print("\nof ceiling over the pairs: " + ", ".join(
            f"{m} mean {sum(s[m] for s in shares) / len(shares):.0%} (min {min(s[m] for s in shares):.0%})"
            for m in shares[0]))


if __name__ == "__main__":
    main()
