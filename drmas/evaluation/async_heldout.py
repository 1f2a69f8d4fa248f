"""Held-out accuracy before and after an asynchronous run, reported the way the colocated run reports it.

In async mode no process holds every model, so the launcher scores them itself: the initial models before
it starts any child, and every learner's final checkpoint after all learners have finished. The problems
(the first `eval.n_problems` of the test split), the sampling (`eval.temperature`) and the per-call seeds
(tags "before" / "after") are those of the colocated run, so the two modes' numbers compare directly.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.evaluation.heldout import heldout_accuracy
from drmas.models import checkpoint
from drmas.rollout.episodes import EpisodeRunner
from drmas.tasks.base import Task


def final_checkpoint_dirs(cfg: DrmasConfig) -> dict[str, Path]:
    """Model id -> HF directory of its learner's newest checkpoint (`learner-<m>/checkpoints/step_<N>/<m>`)."""
    out = Path(cfg.trainer.output_dir)
    dirs = {}
    for model_id in assembly.trained_models(cfg):
        ckpt = checkpoint.latest_checkpoint(out / f"learner-{model_id}")
        if ckpt is None:
            raise FileNotFoundError(f"no checkpoint under {out / f'learner-{model_id}' / 'checkpoints'}")
        dirs[model_id] = ckpt / model_id
    return dirs


def heldout_of_models(cfg: DrmasConfig, tag: str, model_dirs: Optional[dict[str, Path]] = None,
                      task: Optional[Task] = None) -> dict[str, float]:
    """Accuracy and per-agent validity on the held-out problems, with `model_dirs` replacing the configured
    weights of those models (None: every model as configured, i.e. before training). `task`: the run's task
    if already built (the launcher reads its data files once), else built here."""
    task = task if task is not None else assembly.build_task(cfg)
    problems = list(task.split("test"))[: cfg.eval.n_problems]
    if not problems:
        return {}
    paths = {m: assembly.model_path(cfg, m) for m in cfg.models}
    paths.update(model_dirs or {})
    engines = {m: assembly.build_engine(cfg, m, path, cfg.trainer.seed) for m, path in paths.items()}
    runner = EpisodeRunner(assembly.build_orchestra(cfg, task), engines,
                           assembly.agent_specs(cfg, temperature=cfg.eval.temperature),
                           cfg.algorithm.invalid_penalty, seed=cfg.trainer.seed)
    try:
        return heldout_accuracy(runner, problems, tag)
    finally:
        for engine in engines.values():
            if hasattr(engine, "close"):  # a vLLM engine holds its KV cache until shut down
                engine.close()
        del runner, engines
        gc.collect()  # the children about to start need this memory more than the launcher
