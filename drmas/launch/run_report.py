"""What the launcher tells the user about a run as a whole, and keeps under `<output_dir>/eval/`: the held-out
accuracy before and after training, and how to continue a run a signal stopped.

The before-training score is logged at step 0 as soon as the run directory is claimed (as the colocated loop logs
it), not with the after-training one at the end: a run stopped and resumed keeps it, and the resumed run reads it
back for its "before -> after" line instead of evaluating the initial models again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.evaluation.heldout import accuracy_scalars
from drmas.models import checkpoint
from drmas.runtime.metrics import METRICS_FILE, MetricsWriter, read_metrics

EVAL_DIR = "eval"
PACE_DIR = "pace"


def log_accuracy(cfg: DrmasConfig, run_dir: Path, step: int, accuracy: Mapping[str, Optional[float]]) -> None:
    """`eval/accuracy_<tag>` at `step` under `<run_dir>/eval/` (nothing for a None score)."""
    scalars = accuracy_scalars(accuracy)
    if scalars:
        writer = MetricsWriter(run_dir / EVAL_DIR, tensorboard=cfg.logging.tensorboard)
        writer.log(step, scalars)
        writer.close()


def logged_accuracy(run_dir: Path, tag: str) -> Optional[float]:
    """The newest `eval/accuracy_<tag>` an earlier launch of this run logged; None when there is none."""
    path = run_dir / EVAL_DIR / METRICS_FILE
    if not path.is_file():
        return None
    found = [r[f"eval/accuracy_{tag}"] for r in read_metrics(path) if f"eval/accuracy_{tag}" in r]
    return float(found[-1]) if found else None


def resume_hint(cfg: DrmasConfig, signal_name: Optional[str]) -> str:
    """The line a signal-stopped run ends with: each learner's newest checkpoint and the override to continue."""
    out = Path(cfg.trainer.output_dir)
    saved = []
    for model_id in assembly.trained_models(cfg):
        newest = checkpoint.latest_checkpoint(out / f"learner-{model_id}")
        saved.append(f"learner-{model_id} at {newest.name if newest else 'no checkpoint'}")
    how = f"stopped by {signal_name or 'request'}"
    return f"{how}: {', '.join(saved)}; continue with trainer.resume=true"


def report_pace(cfg: DrmasConfig, run_dir: Path) -> list[str]:
    """How generation and each trained model's updates paced each other (`drmas.runtime.pace`), from the
    metrics of the run's learners and rollouts: one line per model, also logged as `pace/<model>/...` at the
    run's last step under `<run_dir>/pace/` (TensorBoard and metrics.jsonl); nothing for a model without the
    figures."""
    from drmas.runtime.pace import pace_of

    rollouts = [read_metrics(p) for p in sorted(run_dir.glob(f"rollout-*/{METRICS_FILE}"))]
    lines, scalars = [], {}
    for model_id in assembly.trained_models(cfg):
        path = run_dir / f"learner-{model_id}" / METRICS_FILE
        if not rollouts or not path.is_file():
            continue
        pace = pace_of(model_id, read_metrics(path), rollouts, cfg.rollout.prompts_per_step * cfg.rollout.group_size,
                       cfg.pipeline.max_staleness)
        if pace is not None:
            lines.append(pace.line())
            scalars.update(pace.scalars())
    if scalars:
        writer = MetricsWriter(run_dir / PACE_DIR, tensorboard=cfg.logging.tensorboard)
        writer.log(cfg.trainer.steps, scalars)
        writer.close()
    return lines
