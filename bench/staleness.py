"""Trained samples per second of the asynchronous pipeline: a staleness bound vs strictly on-policy.

With `pipeline.max_staleness=0` rollouts may only generate for the learner's current version, so rollout
and learner take turns; with a bound of 2 they overlap. Both runs use the same config, seed and process
layout through `drmas run` (buffer, learner(s), rollout(s) as OS processes), one after the other in this
run. Throughput is measured from the learner's metrics between the end of its first step and the end of
its last, so process start-up and model loading are excluded; the ratio is bounded/on-policy.

    python bench/staleness.py --config configs/smoke.yaml --steps 12 [key=value ...]

Pin the thread count (default `trainer.threads=1`): on a small machine the gain comes from rollout and
learner using different cores at the same time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from drmas.runtime.metrics import read_metrics


def run(config: str, staleness: int, steps: int, overrides: list[str], out: Path) -> dict:
    args = [sys.executable, "-m", "drmas.cli", "run", "--config", config, "pipeline.mode=async",
            f"pipeline.max_staleness={staleness}", f"trainer.steps={steps}", f"trainer.output_dir={out}",
            "eval.n_problems=0", "logging.tensorboard=false", "logging.console_every=0", "trainer.overwrite=true",
            *overrides]
    start = time.monotonic()
    proc = subprocess.run(args, capture_output=True, text=True)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"run with max_staleness={staleness} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                         f"\n{proc.stderr[-3000:]}")
    result = {"wall_s": wall, "models": {}}
    for metrics in sorted(out.glob("learner-*/metrics.jsonl")):
        records = read_metrics(metrics)
        model = metrics.parent.name.removeprefix("learner-")
        span = records[-1]["time"] - records[0]["time"]
        trained = sum(r[f"samples/{model}"] for r in records[1:])
        stale = [r[k] for r in records for k in r if k.startswith("staleness/") and k.endswith("/mean")]
        result["models"][model] = {
            "steps": len(records), "samples_per_s": trained / span if span > 0 else float("nan"),
            "mean_staleness": sum(stale) / len(stale) if stale else 0.0,
            "idle": sum(r[f"idle/{model}"] for r in records[1:]) / max(len(records) - 1, 1),
        }
    return result


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
          f"{'idle 0 -> bound':>18}")
    for model in base:
        ratio = bounded[model]["samples_per_s"] / base[model]["samples_per_s"]
        print(f"{model:<16}{base[model]['samples_per_s']:>22.2f}{bounded[model]['samples_per_s']:>22.2f}"
              f"{ratio:>7.2f}x{base[model]['idle']:>10.2f} -> {bounded[model]['idle']:.2f}")


if __name__ == "__main__":
    main()
