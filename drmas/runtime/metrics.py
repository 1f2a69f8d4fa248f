"""Where numbers go: TensorBoard scalars/histograms, one JSON object per step in metrics.jsonl, console lines.

Components return plain `{name: float}` dicts with TensorBoard-style names (`reward/solver/mean`); only this
module knows the sinks, so a component never imports TensorBoard.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Mapping, Optional, TextIO

import numpy as np


METRICS_FILE = "metrics.jsonl"  # a process's per-step records, in its output directory


class MetricsWriter:
    """Fan-out of per-step metrics to metrics.jsonl and (optionally) TensorBoard.

    A run that resumes from its checkpoint of step `resumed_at` logs the steps after it again, and a stopped or
    killed run may have logged some of them already (past its last checkpoint). So no step appears twice:
    metrics.jsonl keeps only its records up to `resumed_at` (rewritten in one step), and TensorBoard hides the
    earlier event files' points past it (`purge_step`, its own mechanism for exactly this)."""

    def __init__(self, output_dir: str | Path, tensorboard: bool = True, resumed_at: int | None = None) -> None:
        self.output_dir = Path(output_dir)
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path = self.output_dir / METRICS_FILE
        if resumed_at is not None and path.exists():
            _keep_records_up_to(path, resumed_at)
        self._jsonl = open(path, "a", buffering=1)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resumed_at is None else resumed_at + 1
            self._tb = SummaryWriter(log_dir=str(self.output_dir / "tensorboard"), purge_step=purge)

    def log(self, step: int, scalars: Mapping[str, float], histograms: Mapping[str, np.ndarray] | None = None,
            at: float | None = None) -> None:
        """One record; `at`: the wall-clock time it stands for (default now), for a record written later than
        its step ended (a learner's, once the step's push ended): throughput is measured between records."""
        at = time.time() if at is None else at
        clean = {k: float(v) for k, v in scalars.items()}
        record = {"step": step, "time": at, **{k: (v if math.isfinite(v) else None) for k, v in clean.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for name, value in clean.items():
                self._tb.add_scalar(name, value, step, walltime=at)
            for name, values in (histograms or {}).items():
                if len(values):
                    self._tb.add_histogram(name, np.asarray(values), step, walltime=at)

    def add_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """TensorBoard points of another log of this run (its evaluations) in this writer's event file, no
        metrics.jsonl record: a second writer into the same directory with its own `purge_step` would purge
        this one's points of the resumed steps whenever TensorBoard reads its file after this one's."""
        if self._tb is not None:
            for name, value in scalars.items():
                self._tb.add_scalar(name, float(value), step)
            self._tb.flush()

    def flush(self) -> None:
        self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self.flush()
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()


PROMPTS_FILE = "prompts.jsonl"  # per step: the draws (drmas.core.draws) and problem uids a learner trained


class StepRecords:
    """A JSON-lines file of one record per step (`{"step": N, ...}`: the prompts a learner trained, the
    evaluations of a run), with `MetricsWriter`'s rule for a resumed run: the records after `resumed_at` (of a
    lost branch: logged past the checkpoint the run resumed from) are dropped when it is opened. Written line
    by line, so a killed process loses no record it wrote; created by its first record, so a run that writes
    none (no `eval.interval`: evals.jsonl) leaves no empty file."""

    def __init__(self, path: str | Path, resumed_at: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_at is not None and self.path.exists():
            _keep_records_up_to(self.path, resumed_at)
        self._handle: Optional[TextIO] = None

    def write(self, record: Mapping) -> None:
        if self._handle is None:
            self._handle = open(self.path, "a", buffering=1)
        self._handle.write(json.dumps(dict(record)) + "\n")

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def _keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records of metrics.jsonl after `step` (a torn last line, from a kill mid-write, goes too)."""
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("step", 0) <= step:
            kept.append(line + "\n")
    staged = path.with_name(path.name + ".tmp")
    staged.write_text("".join(kept))
    staged.replace(path)


def read_metrics(path: str | Path) -> list[dict]:
    """All records of a metrics.jsonl (later records of a resumed run come after earlier ones)."""
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def agent_line(step: int, scalars: Mapping[str, float], agents: list[str], models: list[str]) -> str:
    """One compact console line: per-agent reward/advantage/valid share, per-model loss and grad norm.

    An agent the step's episodes never called (a reviser after only right answers, a learner's batch of
    another agent's groups) has no numbers: it says so instead of printing nan."""
    parts = [f"step {step:>4}"]
    for a in agents:
        if f"reward/{a}/mean" not in scalars:
            parts.append(f"{a}: no calls")
            continue
        r = scalars[f"reward/{a}/mean"]
        sq = scalars.get(f"advantage/{a}/sq_mean", float("nan"))
        v = scalars.get(f"valid/{a}", float("nan"))
        parts.append(f"{a}: r={r:+.3f} A2={sq:.2f} valid={v:.2f}")
    for m in models:
        if f"loss/{m}" not in scalars:
            parts.append(f"{m}: no update")
            continue
        g = scalars.get(f"grad_norm/{m}", float("nan"))
        parts.append(f"{m}: loss={scalars[f'loss/{m}']:+.4f} |g|={g:.3f}")
    return " | ".join(parts)


def reward_stats_line(stats: Mapping[str, Mapping[str, float]]) -> str:
    """Running reward statistics of each agent on one line ({agent: {"mean", "std", "count"}})."""
    return " | ".join(f"{agent}: mean={v['mean']:.3f} std={v['std']:.3f} count={int(v['count'])}"
                      for agent, v in stats.items()) or "none yet"


def spike_summary(values: list[float], factor: float = 3.0) -> dict[str, float]:
    """Median, max and the number of steps whose value exceeds `factor` x the running median of the
    steps before it: the gradient-spike count used to compare normalisation modes.

    The running median is taken over the earlier *non-zero* values: a gradient norm of 0 is a step without
    a gradient (every group's rewards equal), not a scale, and any gradient after it would count as a spike
    against a median of 0. A step with no non-zero value before it is never a spike."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"median": float("nan"), "max": float("nan"), "spikes": 0.0}
    spikes, earlier = 0, []
    for value in finite:
        if earlier and value > factor * float(np.median(earlier)):
            spikes += 1
        if value != 0:
            earlier.append(value)
    return {"median": float(np.median(finite)), "max": float(max(finite)), "spikes": float(spikes)}
