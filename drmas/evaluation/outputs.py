"""Where `drmas eval` results go: a directory of each evaluation's own, holding eval.json, eval.md,
eval_questions.jsonl and its TensorBoard scalars, and the console.

Each evaluation gets `<trainer.output_dir>/evals/<what>-k<k>-<digest>/`: `what` is the evaluated checkpoint
(`step_<N>`, or `initial` for the config's models) and `digest` a hash of everything that decides its
samples (`resume.sample_settings`: models and checkpoints, system, task, sampling, benchmarks), so two
evaluations never write into one directory and TensorBoard shows each as a run of its own, named by what it
evaluated. The same evaluation again is refused, as a second training run into one directory is: it would
give the same samples; `eval.resume=true` continues an interrupted one or extends it with more questions.

`EvalDirSink` is `drmas eval`'s sink (`kinds.checkpoint`). Its report is one plain dict (the evaluator's
scores, then `command.provenance`); every rendering takes that dict, so the JSON, the markdown table, the
TensorBoard scalars and the rich table can never disagree. Per-question results are streamed to
eval_questions.jsonl while the evaluation runs, with every episode's turns and info, so an interrupted
evaluation can be resumed from them (see `resume.py`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from drmas.evaluation.evaluator import EvalSink, Evaluator
from drmas.mas.base import EpisodeOutcome, TurnResult
from drmas.runtime.run_dir import EVALS_DIR
from drmas.tasks.base import Problem

REPORT_FILE = "eval.json"
MARKDOWN_FILE = "eval.md"
QUESTIONS_FILE = "eval_questions.jsonl"


def evaluation_dir(base: Path, checkpoint: Optional[Path], step: int, settings: dict) -> Path:
    """The directory of the evaluation with these sample `settings` of `checkpoint` (at `step`) under `base`."""
    what = "initial" if checkpoint is None else f"step_{step}"
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    return base / EVALS_DIR / f"{what}-k{settings['sampling']['k']}-{digest}"


def check_new_evaluation(out: Path) -> None:
    """ValueError when `out` already holds this evaluation (and eval.resume is not set): a rerun would only
    sample the same episodes again, and used to overwrite eval.json and add its points to TensorBoard twice."""
    if (out / REPORT_FILE).exists():
        raise ValueError(f"{out} already holds this evaluation (the same checkpoint and sampling settings); its "
                         f"results are in {out / REPORT_FILE}. eval.resume=true keeps its questions (a larger "
                         "eval.max_questions adds new ones); delete the directory to sample it again")
    log = out / QUESTIONS_FILE
    if log.exists() and log.stat().st_size > 0:
        raise ValueError(f"{out} holds an interrupted run of this evaluation ({QUESTIONS_FILE}, no {REPORT_FILE}): "
                         "eval.resume=true finishes it; delete the directory to start it again")


def write_report(out: Path, report: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / REPORT_FILE
    path.write_text(json.dumps(report, indent=1) + "\n")
    return path


def outcome_record(outcome: EpisodeOutcome) -> dict:
    """One episode as JSON: reward, final answer, its turns ([agent, valid, text]) and its info."""
    return {
        "reward": float(outcome.reward),
        "final_answer": outcome.final_answer,
        "turns": [[t.agent, bool(t.valid), t.text] for t in outcome.turns],
        "info": json.loads(json.dumps(outcome.info, default=str)),
    }


def outcome_from_record(record: dict) -> EpisodeOutcome:
    """The inverse of `outcome_record` (KeyError / TypeError / ValueError for a malformed record)."""
    turns = [TurnResult(str(agent), str(text), bool(valid)) for agent, valid, text in record["turns"]]
    info = record["info"]
    if not isinstance(info, dict):
        raise TypeError(f"'info' must be an object, got {type(info).__name__}")
    return EpisodeOutcome(float(record["reward"]), turns, str(record["final_answer"]), info)


class QuestionLog:
    """`eval_questions.jsonl`, one line per question (benchmark, uid, gold answer, the k rewards and final
    answers, and the k episodes in full), appended as each chunk of questions finishes: an evaluation that
    is interrupted or killed still leaves every question it completed. `keep` are earlier records (of a
    resumed evaluation) written first."""

    def __init__(self, out: Path, keep: Sequence[dict] = ()) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / QUESTIONS_FILE
        staged = self.path.with_name(QUESTIONS_FILE + ".tmp")  # replaced in one step: a kill now loses nothing
        with staged.open("w") as handle:
            handle.writelines(json.dumps(record) + "\n" for record in keep)
        os.replace(staged, self.path)
        self._handle = self.path.open("a", buffering=1)

    def append(self, benchmark: str, problems: Sequence[Problem], outcomes: Sequence[Sequence[EpisodeOutcome]]) -> None:
        for problem, row in zip(problems, outcomes):
            record = {
                "benchmark": benchmark,
                "uid": problem.uid,
                "answer": problem.answer,
                "rewards": [float(o.reward) for o in row],
                "final_answers": [o.final_answer for o in row],
                "episodes": [outcome_record(o) for o in row],
            }
            self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()


class EvalDirSink(EvalSink):
    """Streams each finished question to eval_questions.jsonl (after the `kept` records of the run it resumes),
    then writes the report to eval.json, eval.md and (with `tensorboard`) TensorBoard at its step.
    `provenance`: what the report says after the scores (`command.provenance`); `on_question(benchmark)`: a
    question finished (the progress bar). `close()` when done, finished or not."""

    def __init__(self, out: Path, provenance: dict, agent_names: Sequence[str], tensorboard: bool,
                 kept: Sequence[dict] = (), on_question: Callable[[str], None] = lambda _: None) -> None:
        self.out, self.provenance, self.agent_names, self.tensorboard = out, provenance, tuple(agent_names), tensorboard
        self.on_question = on_question
        self.questions = QuestionLog(out, keep=kept)

    def question(self, benchmark: str, problem: Problem, outcomes: list[EpisodeOutcome]) -> None:
        self.questions.append(benchmark, [problem], [outcomes])
        self.on_question(benchmark)

    def report(self, evaluation: Evaluator) -> dict:
        report = {**evaluation.scores(self.agent_names), **self.provenance,
                  "wall_seconds": time.monotonic() - evaluation.started_at, "resumed_questions": evaluation.resumed}
        write_report(self.out, report)
        (self.out / MARKDOWN_FILE).write_text(markdown(report))
        if self.tensorboard:
            write_tensorboard(self.out, report)
        return report

    def close(self) -> None:
        self.questions.close()


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def markdown(report: dict) -> str:
    """The benchmark table and, per benchmark, the per-agent behaviour table, as markdown."""
    k = report["sampling"]["k"]
    lines = [f"# drmas eval: {report['checkpoint'] or 'initial models'} (step {report['step']})", ""]
    lines += [f"| benchmark | questions | k | avg@{k} | pass@{k} |", "|---|---:|---:|---:|---:|"]
    for name, entry in report["benchmarks"].items():
        lines.append(f"| {name} | {entry['n_questions']} | {entry['k']} | {_fmt(entry['avg@k'])} | {_fmt(entry['pass@k'])} |")
    for name, stats in report.get("behaviour", {}).items():
        lines += ["", f"## behaviour on {name} ({stats['episodes']} episodes)", ""]
        lines += ["| agent | calls / episode | valid share | mean response chars |", "|---|---:|---:|---:|"]
        for agent, a in stats["agents"].items():
            lines.append(
                f"| {agent} | {_fmt(a['calls_per_episode'])} | {_fmt(a['valid_share'])} | {_fmt(a['mean_response_chars'])} |"
            )
        if stats["info"]:
            failures = stats.get("info_on_failures", {})
            lines += ["", "| episode statistic | mean per episode | mean per failed episode |", "|---|---:|---:|"]
            lines += [f"| {key} | {_fmt(value)} | {_fmt(failures.get(key))} |" for key, value in stats["info"].items()]
    return "\n".join(lines) + "\n"


def tensorboard_scalars(report: dict) -> dict[str, float]:
    """`eval/<benchmark>/avg@k`, `eval/<benchmark>/pass@k`, and the behaviour numbers under the same prefix
    (`on_failures/<key>`: an episode statistic over the failed episodes, e.g. the verifier's approvals of wrong
    answers)."""
    scalars: dict[str, float] = {}
    for name, entry in report["benchmarks"].items():
        scalars[f"eval/{name}/avg@k"] = entry["avg@k"]
        scalars[f"eval/{name}/pass@k"] = entry["pass@k"]
    for name, stats in report.get("behaviour", {}).items():
        for agent, a in stats["agents"].items():
            scalars[f"eval/{name}/calls_per_episode/{agent}"] = a["calls_per_episode"]
            if a["valid_share"] is not None:
                scalars[f"eval/{name}/valid/{agent}"] = a["valid_share"]
        for key, value in stats["info"].items():
            scalars[f"eval/{name}/info/{key}"] = value
        for key, value in stats.get("info_on_failures", {}).items():
            scalars[f"eval/{name}/on_failures/{key}"] = value
    return scalars


def write_tensorboard(out: Path, report: dict) -> Path:
    """Add the report's scalars at step = the checkpoint's step to `<out>/tensorboard`; a resumed evaluation's
    points replace the earlier ones (TensorBoard's `purge_step`), never stand beside them."""
    from torch.utils.tensorboard import SummaryWriter

    log_dir = out / "tensorboard"
    writer = SummaryWriter(log_dir=str(log_dir), purge_step=report["step"])
    try:
        for tag, value in tensorboard_scalars(report).items():
            writer.add_scalar(tag, float(value), report["step"])
    finally:
        writer.close()
    return log_dir


def print_report(report: dict) -> None:
    """The benchmark scores, per-agent behaviour and the episode statistics (`info`: one number per episode, so
    a table of its own, as in eval.md) as rich tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    k = report["sampling"]["k"]
    table = Table(title=f"drmas eval: {report['checkpoint'] or 'initial models'} (step {report['step']})")
    for column in ("benchmark", "questions", f"avg@{k}", f"pass@{k}"):
        table.add_column(column, justify="left" if column == "benchmark" else "right")
    for name, entry in report["benchmarks"].items():
        table.add_row(name, str(entry["n_questions"]), _fmt(entry["avg@k"]), _fmt(entry["pass@k"]))
    console.print(table)
    behaviour = Table(title="behaviour per agent")
    for column in ("benchmark", "agent", "calls / episode", "valid share"):
        behaviour.add_column(column, justify="left" if column in ("benchmark", "agent") else "right")
    episodes = Table(title="episode statistics")
    for column in ("benchmark", "statistic", "mean per episode", "mean per failed episode"):
        episodes.add_column(column, justify="left" if column in ("benchmark", "statistic") else "right")
    for name, stats in report.get("behaviour", {}).items():
        for agent, a in stats["agents"].items():
            behaviour.add_row(name, agent, _fmt(a["calls_per_episode"]), _fmt(a["valid_share"]))
        failures = stats.get("info_on_failures", {})
        for key, value in stats["info"].items():
            episodes.add_row(name, key, _fmt(value), _fmt(failures.get(key)))
    console.print(behaviour)
    if episodes.row_count:
        console.print(episodes)
