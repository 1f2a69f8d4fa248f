"""Where evaluations during training go: evals.jsonl (one record per evaluation) and TensorBoard `eval/...`.

The file sits next to a metrics.jsonl: in the run directory when colocated, in `<output_dir>/eval/` in the
asynchronous pipeline (beside the launcher's held-out accuracy before and after, whichever rollout or launcher
makes an evaluation), and its scalars go to that directory's TensorBoard run, at step = the version evaluated,
so the `eval/` curves share their x axis with the learners' curves. The scalars are those of `drmas eval`
(`outputs.tensorboard_scalars`): one naming for both.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

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
