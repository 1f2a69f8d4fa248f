"""`drmas run` with pipeline.mode=async: the launcher starts, merges and stops the pipeline's processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drmas import assembly
from drmas.config import load_config
from drmas.launcher import assign_ports
from drmas.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"

pytestmark = pytest.mark.timeout(420)  # covers a cold build of the smoke model; the runs have their own limits

ASYNC = [
    "pipeline.mode=async", "pipeline.learner_base_port=0", "trainer.threads=1", "logging.tensorboard=false",
    "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0", "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0",
    "pipeline.report_interval_s=0.5", "pipeline.weights.timeout_s=10", "pipeline.weights.ready_timeout_s=10",
    "pipeline.weights.join_retry_s=0.2", "pipeline.weights.heartbeat_s=0.25", "pipeline.weights.peer_timeout_s=3",
]


@pytest.fixture(scope="module")
def smoke_model() -> Path:
    return assembly.model_path(load_config(SMOKE), "policy")


def _drmas_run(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={out}",
            *ASYNC, *overrides]


def _pids(output: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in re.findall(r"\[launcher\] started (\S+) \(pid (\d+)\)", output)}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _logged_steps(path: Path) -> int:
    return len(read_metrics(path)) if path.exists() else 0


def test_assign_ports_fills_only_port_zero():
    cfg = load_config(SMOKE, ["pipeline.learner_base_port=0", "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0"])
    assigned = assign_ports(cfg)
    assert assigned.pipeline.buffer.producer_endpoint == cfg.pipeline.buffer.producer_endpoint
    assert not assigned.pipeline.buffer.consumer_endpoint.endswith(":0")
    assert assigned.pipeline.learner_ports["policy"] > 0 and cfg.pipeline.learner_ports == {}


def test_launcher_runs_the_pipeline_to_the_end_with_merged_logs(tmp_path, smoke_model):
    out = tmp_path / "run"
    done = subprocess.run(_drmas_run(out, "trainer.steps=2", "pipeline.num_rollouts=2"), cwd=ROOT,
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(_pids(done.stdout)) == {"buffer", "learner-policy", "rollout-0", "rollout-1"}
    assert all(_gone(pid) for pid in _pids(done.stdout).values())
    for name in ("buffer", "learner-policy", "rollout-0", "rollout-1"):
        assert f"[{name}] " in done.stdout
    assert [r["step"] for r in read_metrics(out / "learner-policy" / "metrics.jsonl")] == [1, 2]
    assert (out / "config.yaml").read_text().count(":0\n") == 0  # children got real ports
    for index in (0, 1):
        assert read_metrics(out / f"rollout-{index}" / "metrics.jsonl")
    # held-out accuracy of the initial models and of the learner's final checkpoint, as in colocated runs
    assert "held-out accuracy before training" in done.stdout and "held-out accuracy after training" in done.stdout
    (scored,) = read_metrics(out / "eval" / "metrics.jsonl")
    assert 0 <= scored["eval/accuracy_before"] <= 1 and 0 <= scored["eval/accuracy_after"] <= 1


def test_launcher_stops_everything_when_a_child_dies(tmp_path, smoke_model):
    out = tmp_path / "run"
    log = tmp_path / "launcher.log"
    with open(log, "w") as sink:
        launcher = subprocess.Popen(_drmas_run(out, "trainer.steps=1000"), cwd=ROOT, stdout=sink,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _logged_steps(out / "learner-policy" / "metrics.jsonl"):  # training is under way
            assert time.monotonic() < deadline and launcher.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(_pids(log.read_text())["rollout-0"], signal.SIGKILL)
        assert launcher.wait(60) == 1, log.read_text()[-3000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            for pid in _pids(log.read_text()).values():  # its children live in sessions of their own
                if not _gone(pid):
                    os.killpg(pid, signal.SIGKILL)
    output = log.read_text()
    assert "rollout-0 exited with code -9: stopping the run" in output
    assert all(_gone(pid) for pid in _pids(output).values()), output[-3000:]
    assert (out / "learner-policy" / "checkpoints").is_dir()  # the learner was stopped cleanly and saved


def test_smoke_async_config_trains_two_models_with_two_rollouts(tmp_path):
    """configs/smoke_async.yaml: solver and verifier on separate models, so one learner each."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke_async.yaml"),
               f"trainer.output_dir={out}", *ASYNC]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(_pids(done.stdout)) == {"buffer", "learner-solver_model", "learner-verifier_model",
                                       "rollout-0", "rollout-1"}
    for model, agent in (("solver_model", "solver"), ("verifier_model", "verifier")):
        records = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(r[f"staleness/{agent}/max"] <= 1 for r in records)  # pipeline.max_staleness=1
