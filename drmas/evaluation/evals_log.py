"""Where evaluations during training go: evals.jsonl (one record per evaluation) and TensorBoard `eval/...`.

The file sits next to a metrics.jsonl: in the run directory when colocated, in `<output_dir>/eval/` in the
asynchronous pipeline (beside the launcher's held-out accuracy before and after, whichever rollout or launcher
makes an evaluation), and its scalars go to that directory's TensorBoard run, at step = the version evaluated,
so the `eval/` curves share their x axis with the learners' curves. The scalars are those of `drmas eval`
(`outputs.tensorboard_scalars`): one naming for both. `IntervalSink` is `eval.interval`'s sink (`kinds.interval`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from drmas.evaluation.evaluator import EvalSink, Evaluator
from drmas.evaluation.outputs import tensorboard_scalars
from drmas.runtime.metrics import MetricsWriter, StepRecords

EVALS_FILE = "evals.jsonl"
ASYNC_EVAL_DIR = "eval"  # under trainer.output_dir: the asynchronous pipeline's evaluations


class EvalLog:
    """Appends evaluation reports to `<directory>/evals.jsonl` and their scalars to `<directory>/tensorboard`.

    A run resumed from its checkpoint at `resumed_at` keeps only the records up to it (later ones are
    measured again, as the metrics are); `done` is the newest version already evaluated, so a resumed run
    or a restarted rollout does not evaluate it twice."""

    def __init__(self, directory: str | Path, tensorboard: bool, resumed_at: Optional[int] = None,
                 metrics: Optional[MetricsWriter] = None) -> None:
        """`metrics`: the run's writer into the same directory, whose event file the scalars then share (one
        writer per directory: see `MetricsWriter.add_scalars`); otherwise, with `tensorboard`, a writer of
        its own."""
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / EVALS_FILE
        self._records = StepRecords(self.path, resumed_at=resumed_at)
        self.done = _newest_version(self.path)
        self._metrics = metrics
        self._tb = None
        if tensorboard and metrics is None:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resumed_at is None else resumed_at + 1
            self._tb = SummaryWriter(log_dir=str(self.directory / "tensorboard"), purge_step=purge)

    def write(self, report: dict) -> None:
        self._records.write(report)
        scalars = tensorboard_scalars(report)
        if self._metrics is not None:
            self._metrics.add_scalars(report["version"], scalars)
        elif self._tb is not None:
            for tag, value in scalars.items():
                self._tb.add_scalar(tag, float(value), report["version"])
            self._tb.flush()
        self.done = report["version"]

    def close(self) -> None:
        self._records.close()
        if self._tb is not None:
            self._tb.close()


class IntervalSink(EvalSink):
    """One evaluation's record of evals.jsonl (and its scalars) and its console line (`say`): its scores and
    behaviour (the shapes of `drmas eval`'s eval.json), the `version` it was started at (its step) and, per
    model, the lowest and highest version that made its tokens (`versions`, from the samples themselves
    unless given: in rollout 0's stream a push may land while the evaluation runs)."""

    def __init__(self, evals: EvalLog, version: int, agent_names: Sequence[str], say: Callable[[str], None],
                 versions: Optional[dict[str, list[int]]] = None) -> None:
        self.evals, self.version, self.agent_names, self.say = evals, version, tuple(agent_names), say
        self.versions = versions

    def report(self, evaluation: Evaluator) -> dict:
        spans: dict[str, list[int]] = {}
        samples = 0
        for _, _, model, version in evaluation.calls():
            span = spans.setdefault(model, [version, version])
            span[0], span[1] = min(span[0], version), max(span[1], version)
            samples += 1
        report = {"step": self.version, "version": self.version, "versions": spans if self.versions is None else self.versions,
                  **evaluation.scores(self.agent_names), "samples": samples, "sampling": evaluation.source.sampling,
                  "wall_seconds": time.monotonic() - evaluation.started_at}
        self.evals.write(report)
        self.say(summary_line(report))
        return report


def _newest_version(path: Path) -> Optional[int]:
    """The newest version evals.jsonl holds (a torn last line, from a kill mid-write, is skipped)."""
    if not path.exists():
        return None
    versions = []
    for line in path.read_text().splitlines():
        try:
            versions.append(int(json.loads(line)["version"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(versions, default=None)


def summary_line(report: dict) -> str:
    """One console line: the version and avg@k / pass@k of every benchmark."""
    k = report["sampling"]["k"]
    scores = ", ".join(f"{name} avg@{k} {entry['avg@k']:.3f} pass@{k} {entry['pass@k']:.3f}"
                       for name, entry in report["benchmarks"].items())
    return f"eval at version {report['version']}: {scores} ({report['wall_seconds']:.1f} s)"
