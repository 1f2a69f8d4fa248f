"""The scripts that draw figures: their numbers come out without matplotlib (the `bench` extra), with one line
on how to get the picture, and the picture goes next to the run, never over the tracked docs/staleness.png.
(Before: a ModuleNotFoundError traceback after `make install`, and once installed it overwrote the file.)"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

from drmas.config import read_config, to_yaml
from drmas.runtime.metrics import MetricsWriter

ROOT = Path(__file__).resolve().parents[1]
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def _async_run_metrics(run: Path) -> None:
    """The files an async run leaves that the staleness script reads, in the format its processes write."""
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(read_config(ROOT / "configs" / "smoke_async.yaml")))
    learner = MetricsWriter(run / "learner-solver_model", tensorboard=False)
    for step in (1, 2, 3):
        learner.log(step, {"staleness/solver/mean": 0.5, "staleness/solver/max": 1.0, "idle/solver_model": 0.25})
    learner.close()
    buffer = MetricsWriter(run / "buffer", tensorboard=False)
    for record, depth in enumerate((0, 2, 1)):
        buffer.log(record, {"buffer/solver/depth": depth})
    buffer.close()


def test_the_staleness_figures_come_out_next_to_the_run_and_never_over_the_tracked_picture(tmp_path):
    tracked = ROOT / "docs" / "staleness.png"
    before = hashlib.sha256(tracked.read_bytes()).hexdigest()
    run = tmp_path / "run"
    _async_run_metrics(run)
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "plot_staleness.py"), str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bound pipeline.max_staleness=1" in done.stdout and "   3 | 0.50 / 1.00 | 0.25" in done.stdout
    assert "buffer/solver/depth: at most 2 queued groups" in done.stdout
    if HAVE_MATPLOTLIB:
        assert (run / "staleness.png").is_file() and f"wrote {run / 'staleness.png'}" in done.stdout
    else:
        assert "not drawn, matplotlib is not installed: pip install 'drmas[bench]'" in done.stdout
        assert not (run / "staleness.png").exists()
    assert hashlib.sha256(tracked.read_bytes()).hexdigest() == before


def test_the_eval_curves_are_read_from_the_event_files_and_drawn_next_to_the_run(tmp_path):
    from drmas.evaluation.evals_log import EvalLog

    run = tmp_path / "run"
    evals = EvalLog(run / "eval", tensorboard=True)  # where an async run's evaluations go
    for version, score in ((0, 0.25), (2, 0.5)):
        evals.write({"version": version, "step": version,
                     "benchmarks": {"arithmetic": {"avg@k": score, "pass@k": 2 * score, "k": 4, "n_questions": 8}},
                     "behaviour": {"arithmetic": {"episodes": 32, "info": {}, "info_on_failures": {"approved": 0.75},
                                                  "agents": {"verifier": {"calls_per_episode": 1.0, "valid_share": 0.5}}}}})
    evals.close()
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "plot_eval.py"), str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "version | arithmetic/avg@k | arithmetic/pass@k | arithmetic/valid/verifier | " \
           "arithmetic/on_failures/approved" in done.stdout
    assert "      2 | 0.500 | 1.000 | 0.500 | 0.750" in done.stdout
    if HAVE_MATPLOTLIB:
        assert (run / "eval.png").is_file() and f"wrote {run / 'eval.png'}" in done.stdout
    else:
        assert "not drawn, matplotlib is not installed" in done.stdout and not (run / "eval.png").exists()
