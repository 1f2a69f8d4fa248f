"""`drmas eval --config FILE [--checkpoint DIR [--version N]] [key=value ...]`: avg@k / pass@k of a checkpoint.

The evaluation is built from the same assembly functions as training (task, orchestra, engines, agent
specs), so it works for any registered multi-agent system. Each question of each benchmark gets
`eval.k` sampled episodes (temperature `eval.k_temperature`, top_p `eval.k_top_p` for every agent,
per-call seeds from `trainer.seed`); results go to a directory of the evaluation's own under
`trainer.output_dir/evals/`, named by the checkpoint and a digest of the settings (see `outputs.py`).

Setup (config, checkpoint, models, benchmarks) is done before any episode runs, and every mistake found
there ends the command with exit code 2 and a message naming the key or path at fault.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig
from drmas.episodes import EpisodeRunner
from drmas.evaluation import kinds, outputs, resume
from drmas.evaluation.kinds import eval_agent_specs, load_benchmarks, validate_eval_config
from drmas.evaluation.models import ModelSource, checkpoint_step, model_sources
from drmas.models import checkpoint as run_checkpoint
from drmas.tasks.base import Problem


@dataclass
class Evaluation:
    """Everything `drmas eval` needs, built and checked before the first episode."""

    cfg: DrmasConfig
    checkpoint: Optional[Path]
    step: int
    out: Path  # this evaluation's directory (`outputs.evaluation_dir`)
    model_dirs: dict[str, Path]
    runner: EpisodeRunner
    benchmarks: dict[str, list[Problem]]
    agents: tuple[str, ...]
    settings: dict = field(default_factory=dict)  # what decides the samples (eval_run.json)
    kept: list[dict] = field(default_factory=list)  # eval.resume: the earlier evaluation's question records
    done: dict = field(default_factory=dict)  # eval.resume: (benchmark, uid) -> its k outcomes
    sources: dict[str, ModelSource] = field(default_factory=dict)  # which checkpoint each model came from

    def model_checkpoints(self) -> dict[str, Optional[dict]]:
        """Model id -> {checkpoint, step} it was taken from (None: the config's weights), for eval.json."""
        return {model_id: source.record() for model_id, source in self.sources.items()}


def prepare(cfg: DrmasConfig, checkpoint: Optional[Path], version: Optional[int] = None) -> Evaluation:
    """Check the eval config, resolve model directories, build task, orchestra, engines and the runner.

    `checkpoint` is one checkpoint or a run directory (each trained model's newest complete checkpoint, or
    `version`'s). Raises ValueError / FileNotFoundError / KeyError naming the config key or path at fault, and
    ValueError when the evaluation's directory holds this evaluation already (unless `eval.resume`)."""
    validate_eval_config(cfg.eval)
    checkpoint = None if checkpoint is None else checkpoint.resolve()  # one evaluation, however the path is written
    assembly.require_packages(cfg)
    if cfg.trainer.threads > 0:
        import torch

        torch.set_num_threads(cfg.trainer.threads)
    run_checkpoint.seed_everything(cfg.trainer.seed)
    sources = model_sources(cfg, checkpoint, version)
    model_dirs = {model_id: source.path for model_id, source in sources.items()}
    task = assembly.build_task(cfg)
    benchmarks = load_benchmarks(cfg, task)
    orchestra = assembly.build_orchestra(cfg, task)
    engines = assembly.build_engines(cfg, cfg.trainer.seed, model_dirs)
    runner = assembly.episode_runner(cfg, orchestra, engines, eval_agent_specs(cfg))
    settings = resume.sample_settings(cfg, checkpoint, model_dirs, sources)
    step = evaluated_step(checkpoint, sources)
    out = outputs.evaluation_dir(Path(cfg.trainer.output_dir), checkpoint, step, settings)
    if cfg.eval.resume:
        kept, done = resume.completed_questions(out, settings)
    else:
        outputs.check_new_evaluation(out)
        kept, done = [], {}
    return Evaluation(cfg, checkpoint, step, out, model_dirs, runner, benchmarks, tuple(orchestra.agents), settings,
                      kept, done, sources)


def evaluated_step(checkpoint: Optional[Path], sources: dict[str, ModelSource]) -> int:
    """The step eval results are filed under (TensorBoard, eval.json): the checkpoint's, or with a run
    directory the newest of its models' checkpoints (in an async run each learner counts its own versions)."""
    steps = [source.step for source in sources.values() if source.step is not None]
    return max(steps) if steps else checkpoint_step(checkpoint)


def run_evaluation(ev: Evaluation, questions_per_chunk: Optional[int] = None,
                   log: Callable[[str], None] = print) -> dict:
    """Sample every benchmark, write eval.json / eval.md / eval_questions.jsonl / TensorBoard scalars to the
    evaluation's directory, and return the report (the content of eval.json)."""
    from tqdm import tqdm

    from drmas.runtime.process import progress_bars_on

    cfg, k, out = ev.cfg, ev.cfg.eval.k, ev.out
    for stale in (outputs.REPORT_FILE, outputs.MARKDOWN_FILE):  # never leave an earlier run's results beside
        (out / stale).unlink(missing_ok=True)  # this run's questions if it is interrupted
    resume.write_settings(out, ev.settings)
    total = sum(len(problems) for problems in ev.benchmarks.values())
    shown = [next(iter(ev.benchmarks))]  # the benchmark the bar names: that of the question finished last
    with tqdm(total=total * k, desc="eval", unit="episode", postfix=shown[0],
              disable=not progress_bars_on(cfg.logging.progress_bar)) as bar:
        def progress(benchmark: str) -> None:
            if shown[0] != benchmark:
                shown[0] = benchmark
                bar.set_postfix_str(benchmark)
            bar.update(k)

        evaluation = kinds.checkpoint(cfg, ev.benchmarks, out, provenance(ev), ev.agents, ev.kept, ev.done, progress)
        try:
            if cfg.eval.resume:
                log(f"eval.resume: {evaluation.resumed} of {total} questions taken from {out / outputs.QUESTIONS_FILE}")
            bar.update(evaluation.resumed * k)
            report = evaluation.run(ev.runner, questions_per_chunk)
        finally:
            evaluation.sink.close()
    log(f"eval results written to {out / outputs.REPORT_FILE}")
    return report


def provenance(ev: Evaluation) -> dict:
    """What eval.json says after the scores: what was evaluated, how it was sampled, the system and the task."""
    cfg = ev.cfg
    return {
        "checkpoint": str(ev.checkpoint) if ev.checkpoint is not None else None,
        "step": ev.step,
        "models": {model_id: str(path) for model_id, path in ev.model_dirs.items()},
        "model_checkpoints": ev.model_checkpoints(),
        "sampling": kinds.sampling_record(cfg),
        "system": cfg.system.name,
        "task": cfg.task.name,
    }


# ---------------------------------------------------------------------------------------- command line


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `eval` on the `drmas` sub-command parsers (`args.func(args)` runs it)."""
    parser = subparsers.add_parser(
        "eval", help="avg@k / pass@k of a checkpoint (or the config's initial models) on the task's benchmarks")
    parser.add_argument("--config", "-c", help="YAML config file (defaults are the schema's)")
    parser.add_argument(
        "--checkpoint", type=Path, default=None,
        help="a run directory (colocated or async: each trained model's newest complete checkpoint), or one "
             "checkpoint (checkpoints/step_<N>, learner-<model>/checkpoints/step_<N>); omitted: evaluate the "
             "models the config names")
    parser.add_argument(
        "--version", type=int, default=None, metavar="N",
        help="with a run directory: evaluate each trained model's checkpoint step_<N> instead of the newest")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides, e.g. eval.k=4")
    parser.set_defaults(func=main)
    return parser


def main(args: argparse.Namespace) -> int:
    """Run `drmas eval`; exit code 2 (and a message on stderr) for a config, path or data mistake."""
    from drmas.assembly import load_config
    from drmas.config import ConfigError

    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"drmas eval: config error: {exc}", file=sys.stderr)
        return 2
    try:
        ev = prepare(cfg, args.checkpoint, args.version)
    except (FileNotFoundError, ValueError, KeyError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"drmas eval: {message}", file=sys.stderr)
        return 2
    try:
        report = run_evaluation(ev)
    finally:
        assembly.close_orchestra(ev.runner.orchestra)  # the external system's gateway and program stop here
    outputs.print_report(report)
    return 0


def cli(argv: Optional[list[str]] = None) -> int:
    """`python -m drmas.evaluation.command eval ...`: the sub-command without the rest of `drmas`."""
    parser = argparse.ArgumentParser(prog="drmas")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(cli())
