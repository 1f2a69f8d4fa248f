"""The GPU figures of a finished `drmas run` (async pipeline), from the metrics its processes wrote.

    python bench/run_figures.py RUN_DIR

One `FIGURE` line each (medians over the run, the first step left out: it includes start-up): the rollouts'
generation rate (`throughput/rollout/tokens_per_s`), per learner its step time (and the part of it spent
waiting for a batch), its push time and rate (the bytes are in the engines' dtype), and the largest
on-policy gap (max |learner - engine| log-prob per token on samples of the learner's current weights).
Exit 1 when the run left no metrics to read.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas.runtime.metrics import read_metrics  # noqa: E402


def figure(name: str, value: float, unit: str, details: str = "") -> None:
    print(f"FIGURE {name} {value:.4g} {unit}" + (f" ({details})" if details else ""), flush=True)


def main() -> None:
    run = Path(sys.argv[1])
    rates = [r["throughput/rollout/tokens_per_s"] for path in sorted(run.glob("rollout-*/metrics.jsonl"))
             for r in read_metrics(path)[1:] if r.get("throughput/rollout/tokens_per_s", 0) > 0]
    learners = sorted(run.glob("learner-*/metrics.jsonl"))
    if not rates or not learners:
        print(f"run_figures: no rollout or learner metrics under {run}")
        raise SystemExit(1)
    figure("pipeline_rollout_tok_s", statistics.median(rates), "tok/s", f"median of {len(rates)} reports")
    for path in learners:
        model = path.parent.name.removeprefix("learner-")
        steps = [r for r in read_metrics(path) if f"loss/{model}" in r][1:] or read_metrics(path)
        step = statistics.median(r[f"time/{model}/step_seconds"] for r in steps)
        waiting = statistics.median(r[f"time/{model}/step_seconds"] * r[f"idle/{model}"] for r in steps)
        figure(f"pipeline_learner_step_s_{model}", step, "s", f"of which waiting for a batch {waiting:.2f} s")
        push = statistics.median(r[f"weight_sync/{model}/seconds"] for r in steps)
        size = statistics.median(r.get(f"weight_sync/{model}/mb", 0.0) for r in steps)
        figure(f"pipeline_push_s_{model}", push, "s", f"{size:.0f} MB, {size / 1e3 / max(push, 1e-9):.2f} GB/s")
        gaps = [v for r in steps for k, v in r.items() if k.startswith(f"logp_diff/{model}/")]
        if gaps:
            figure(f"pipeline_gap_{model}", max(gaps), "nats", "max |learner - engine| per token, on-policy samples")


if __name__ == "__main__":
    main()
