"""Held-out accuracy before and after an asynchronous run, reported the way the colocated run reports it.

In async mode no process holds every model, so the launcher scores them itself: the initial models before
it starts any child, and every learner's final checkpoint after all learners have finished. The problems
(the first `eval.n_problems` of the test split), the sampling (`eval.temperature`) and the per-call seeds
(tags "before" / "after") are those of the colocated run, so the two modes' numbers compare directly.

With `eval.interval` the launcher also evaluates the final version this way (`final_interval_eval`): rollout 0,
which makes the evaluations during the run, is stopped together with the learners, before it could finish that
one.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.evaluation.command import CHUNK_BATCHES
from drmas.evaluation.evals_log import ASYNC_EVAL_DIR, EvalLog
from drmas.evaluation.heldout import heldout_accuracy
from drmas.evaluation.interval import RunningEvaluation, evaluate_now
from drmas.evaluation.sampling import eval_agent_specs, load_benchmarks
from drmas.models import checkpoint
from drmas.episodes import AgentSpec, EpisodeRunner
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
    problems = list(task.split("test"))[: cfg.eval.n_problems]
    if not problems:
        return {}
    with _runner(cfg, task, model_dirs, assembly.agent_specs(cfg, temperature=cfg.eval.temperature)) as runner:
        return heldout_accuracy(runner, problems, tag)


def final_interval_eval(cfg: DrmasConfig, task: Task, say: Callable[[str], None] = lambda _: None) -> Optional[dict]:
    """eval.interval: evaluate the learners' final checkpoints into the run's eval/evals.jsonl (and TensorBoard)
    at their version, as rollout 0 would have; None (nothing done) when that version is evaluated already.
    `say` gets one line when the evaluation starts (it takes minutes on a CPU)."""
    model_dirs = final_checkpoint_dirs(cfg)
    version = min(checkpoint_version(path) for path in model_dirs.values())
    evals = EvalLog(Path(cfg.trainer.output_dir) / ASYNC_EVAL_DIR, tensorboard=cfg.logging.tensorboard)
    try:
        if evals.done is not None and evals.done >= version:
            return None
        agents = eval_agent_specs(cfg)
        with _runner(cfg, task, model_dirs, agents) as runner:
            evaluation = RunningEvaluation(cfg, version, load_benchmarks(cfg, task), agents, runner.orchestra.agents)
            say(f"evaluating version {version} from the final checkpoints (eval.interval; {evaluation.missing} episodes)")
            report = evaluate_now(runner, evaluation, max(1, CHUNK_BATCHES * cfg.rollout.max_batch_size // cfg.eval.k))
        # engines loaded from a checkpoint stamp their tokens version 0: the weights are those of `version`
        report["versions"] = {model_id: [version, version] for model_id in model_dirs}
        evals.write(report)
        return report
    finally:
        evals.close()


def checkpoint_version(model_dir: Path) -> int:
    """The version of `<learner>/checkpoints/step_<N>/<model>` (an adapter's: `.../step_<N>/<model>/<adapter>`): N."""
    step = next(p.name for p in model_dir.parents if p.name.startswith("step_"))
    return int(step.removeprefix("step_"))


@contextmanager
def _runner(cfg: DrmasConfig, task: Task, model_dirs: Optional[dict[str, Path]],
            agents: Mapping[str, AgentSpec]) -> Iterator[EpisodeRunner]:
    """An episode runner on engines of every model the agents use, `model_dirs` replacing the configured weights
    of those models or adapters (None: every model as configured); the engines are closed and their memory given back after."""
    engines = assembly.build_engines(cfg, cfg.trainer.seed, model_dirs)
    runner = assembly.episode_runner(cfg, assembly.build_orchestra(cfg, task), engines, agents)
    try:
        yield runner
    finally:
        assembly.close_orchestra(runner.orchestra)  # the external system's gateway and program stop here
        for engine in engines.values():
            if hasattr(engine, "close"):  # a vLLM engine holds its KV cache until shut down
                engine.close()
        del runner, engines
        gc.collect()  # the children about to start need this memory more than the launcher
