"""Startup cost of the Ray launcher against the local one: the same `drmas run` of configs/smoke_async.yaml
through `pipeline.launcher=local` and `pipeline.launcher=ray` (a local Ray started by the run), one after the
other in this process's machine, each timed from the command's start to its first learner step (the first
record in a learner's metrics.jsonl) and to its end.

    python bench/launcher_startup.py [--steps 3] [--num-cpus 8]

Prints one line per launcher and the headline `ray/local first step = X.XXx (+N.N s)`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTS_ZERO = ["pipeline.learner_base_port=0", "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0",
              "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0", "logging.tensorboard=false", "trainer.threads=1"]


def timed_run(launcher: str, steps: int, num_cpus: int, out: Path) -> tuple[float, float]:
    """(seconds to the first learner step, seconds to the end) of one run."""
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke_async.yaml"),
               f"trainer.output_dir={out}", f"trainer.steps={steps}", f"pipeline.launcher={launcher}",
               f"pipeline.ray.num_cpus={num_cpus}", *PORTS_ZERO]
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while proc.poll() is None:
        if first is None and any(p.stat().st_size > 0 for p in out.glob("learner-*/metrics.jsonl")):
            first = time.monotonic() - start
        time.sleep(0.05)
    total = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{launcher}: drmas run exited with {proc.returncode}")
    return (first if first is not None else total), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    args = parser.parse_args()
    from drmas import assembly
    from drmas.config import read_config

    cfg = read_config(ROOT / "configs" / "smoke_async.yaml")
    for model in cfg.models:  # built before either run, so neither pays for it
        assembly.model_path(cfg, model)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for launcher in ("local", "ray"):
            results[launcher] = timed_run(launcher, args.steps, args.num_cpus, Path(tmp) / launcher)
            print(f"{launcher:5s}: first learner step after {results[launcher][0]:.1f} s, "
                  f"run of {args.steps} steps {results[launcher][1]:.1f} s", flush=True)
    (lf, lt), (rf, rt) = results["local"], results["ray"]
    print(f"ray/local first step = {rf / lf:.2f}x (+{rf - lf:.1f} s); total = {rt / lt:.2f}x (+{rt - lt:.1f} s)")


if __name__ == "__main__":
    main()
