"""The async launcher's evaluations: they need every model at once, which no process of the pipeline holds.

So the launcher builds engines of its own and drives the evaluator on them, with the kinds the colocated loop
runs (`drmas.evaluation.kinds`), so the two modes' numbers compare directly: held-out accuracy (`kinds.heldout`)
of the initial models before it starts any child and of every learner's final checkpoint after all learners
have finished; with `eval.interval`, the final version's evaluation (`kinds.interval`, `final_interval_eval`):
rollout 0, which makes the evaluations during the run, is stopped together with the learners, before it could
finish that one.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.episodes import EpisodeRunner
from drmas.evaluation import kinds
from drmas.evaluation.evals_log import ASYNC_EVAL_DIR, EvalLog
from drmas.models import checkpoint
from drmas.tasks.base import Task


def final_checkpoint_dirs(cfg: DrmasConfig) -> dict[str, Path]:
    """Model id -> HF directory (an adapter's: peft directory) of its learner's newest checkpoint
    (`learner-<m>/checkpoints/step_<N>/<m>`)."""
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
    evaluation = kinds.heldout(cfg, task, tag)
    if evaluation.finished:  # no problems: no engine to build
        return {}
    with _runner(cfg, task, model_dirs) as runner:
        return evaluation.run(runner)


def final_interval_eval(cfg: DrmasConfig, task: Task, say: Callable[[str], None] = lambda _: None) -> Optional[dict]:
    """eval.interval: evaluate the learners' final checkpoints into the run's eval/evals.jsonl (and TensorBoard)
    at their version, as rollout 0 would have; None (nothing done) when that version is evaluated already.
    `say` gets one line when the evaluation starts (it takes minutes on a CPU) and its summary."""
    model_dirs = final_checkpoint_dirs(cfg)
    version = min(checkpoint_version(path) for path in model_dirs.values())
    evals = EvalLog(Path(cfg.trainer.output_dir) / ASYNC_EVAL_DIR, tensorboard=cfg.logging.tensorboard)
    try:
        if evals.done is not None and evals.done >= version:
            return None
        with _runner(cfg, task, model_dirs) as runner:
            # engines loaded from a checkpoint stamp their tokens version 0: the weights are those of `version`
            evaluation = kinds.interval(cfg, kinds.load_benchmarks(cfg, task), version, evals, runner.orchestra.agents,
                                        say, versions={model_id: [version, version] for model_id in model_dirs})
            say(f"evaluating version {version} from the final checkpoints (eval.interval; {evaluation.missing} episodes)")
            return evaluation.run(runner)
    finally:
        evals.close()


def checkpoint_version(model_dir: Path) -> int:
    """The version of `<learner>/checkpoints/step_<N>/<model>` (an adapter's: `.../step_<N>/<model>/<adapter>`): N."""
    step = next(p.name for p in model_dir.parents if p.name.startswith("step_"))
    return int(step.removeprefix("step_"))


@contextmanager
def _runner(cfg: DrmasConfig, task: Task, model_dirs: Optional[dict[str, Path]]) -> Iterator[EpisodeRunner]:
    """An episode runner on engines of every model the agents use, `model_dirs` replacing the configured weights
    of those models or adapters (None: every model as configured); the engines are closed and their memory
    given back after. It samples as training does: every evaluation's source names its own sampling."""
    engines = assembly.build_engines(cfg, cfg.trainer.seed, model_dirs)
    runner = assembly.episode_runner(cfg, assembly.build_orchestra(cfg, task), engines, assembly.agent_specs(cfg))
    try:
        yield runner
    finally:
        assembly.close_orchestra(runner.orchestra)  # the external system's gateway and program stop here
        for engine in engines.values():
            if hasattr(engine, "close"):  # a vLLM engine holds its KV cache until shut down
                engine.close()
        del runner, engines
        gc.collect()  # the children about to start need this memory more than the launcher
