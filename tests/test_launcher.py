"""`drmas run` with pipeline.mode=async: the launcher starts, merges and stops the pipeline's processes."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_run import run_cli
from pipeline_harness import smoke_async_models  # noqa: F401  (a fixture)

from drmas import assembly
from drmas.config import read_config
from drmas.launch.local import assign_ports
from drmas.learner.allocator import jemalloc_library
from drmas.runtime.metrics import read_metrics

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
    return assembly.model_path(read_config(SMOKE), "policy")


def _drmas_run(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={out}",
            *ASYNC, *overrides]


def _pids(output: str) -> dict[str, int]:
    return {name: int(pid) for name, pid in re.findall(r"\[launcher\] started (\S+) \(pid (\d+)[^)]*\)", output)}


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _logged_steps(path: Path) -> int:
    return len(read_metrics(path)) if path.exists() else 0


def test_assign_ports_fills_only_port_zero():
    cfg = read_config(SMOKE, ["pipeline.buffer.producer_endpoint=tcp://127.0.0.1:5601"])  # the rest: port 0
    assigned = assign_ports(cfg)
    assert assigned.pipeline.buffer.producer_endpoint == cfg.pipeline.buffer.producer_endpoint
    assert not assigned.pipeline.buffer.consumer_endpoint.endswith(":0")
    assert assigned.pipeline.learner_ports["policy"] > 0 and cfg.pipeline.learner_ports == {}


class _Background:
    """`drmas run` in the background, its output in a file; killed with its children whatever happens."""

    def __init__(self, tmp_path: Path, command: list[str], env: dict[str, str] | None = None) -> None:
        self.log = tmp_path / "launcher.log"
        with open(self.log, "w") as sink:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=env)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, condition, what: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, f"{what} not reached\n{self.output()[-3000:]}"
            assert self.proc.poll() is None, f"the launcher ended before {what}\n{self.output()[-3000:]}"
            time.sleep(0.2)

    def kill_child(self, name: str) -> int:
        pid = _pids(self.output())[name]
        os.kill(pid, signal.SIGKILL)
        return pid

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in re.findall(r"\[launcher\] started \S+ \(pid (\d+)[^)]*\)", self.output()):
            if not _gone(int(pid)):  # children live in sessions of their own
                os.killpg(int(pid), signal.SIGKILL)


@pytest.mark.e2e
def test_launcher_runs_the_pipeline_through_a_dead_rollout_and_a_dead_learner(tmp_path, smoke_model):
    """Buffer, learner and two rollouts with merged logs and held-out accuracy before and after. kill -9 of a
    rollout, then of the learner: each is restarted (the learner from its checkpoint) and the run ends
    normally; before, the first death stopped every process. Under pipeline.gpus each process sees its own
    GPUs, also after a restart (CUDA_VISIBLE_DEVICES is all the launcher hands out, so a CPU machine that
    claims three GPUs shows it: CPU torch ignores the variable)."""
    out = tmp_path / "run"
    metrics = out / "learner-policy" / "metrics.jsonl"
    run = _Background(tmp_path, _drmas_run(out, "trainer.steps=5", "trainer.checkpoint_interval=1",
                                           "pipeline.num_rollouts=2", "pipeline.restarts.backoff_s=0.5",
                                           "pipeline.buffer.producer_timeout_s=3", "pipeline.gpus.rollouts=[1, 2]",
                                           "pipeline.gpus.learners={policy: [0]}"),
                      env={**os.environ, "CUDA_VISIBLE_DEVICES": "5,6,7"})
    try:
        run.wait_for(lambda: _logged_steps(metrics) >= 1, "learner step 1")
        pids = _pids(run.output())
        for name, gpus in (("rollout-0", "6"), ("rollout-1", "7"), ("learner-policy", "5"), ("buffer", "5,6,7")):
            assert f"CUDA_VISIBLE_DEVICES={gpus}\0" in Path(f"/proc/{pids[name]}/environ").read_text(), name
        first_rollout = run.kill_child("rollout-0")
        run.wait_for(lambda: _logged_steps(metrics) >= 3, "learner step 3 after the rollout restart")
        run.kill_child("learner-policy")
        assert run.proc.wait(180) == 0, run.output()[-3000:]
    finally:
        run.cleanup()
    output = run.output()
    # no progress bar in the merged log (transformers' weight loading and saving drew one per model load)
    assert not re.search(r"it/s\]|\d+%\|", output), [line for line in output.splitlines() if "it/s]" in line][:3]
    assert "rollout-0 exited with code -9: restarting it in 0.5 s (restart 1 of 3)" in output
    assert len(re.findall(r"started rollout-0 \(pid \d+ on GPUs 6\)", output)) == 2  # the same GPU again
    assert "learner-policy exited with code -9: restarting it in 0.5 s (restart 1 of 3)" in output
    assert _pids(output)["rollout-0"] != first_rollout and all(_gone(pid) for pid in _pids(output).values())
    assert re.search(r"\[learner-policy\] .*resumed from \S+ at version [23]", output), output[-3000:]
    steps = [r["step"] for r in read_metrics(metrics)]
    assert steps == [1, 2, 3, 4, 5]  # the restarted learner's steps replace what the killed one logged past its checkpoint
    assert set(_pids(output)) == {"buffer", "learner-policy", "rollout-0", "rollout-1"}
    for name in ("buffer", "learner-policy", "rollout-0", "rollout-1"):  # merged, and each in its own log file
        assert f"[{name}] " in output and "INFO" in (out / name / "process.log").read_text()
        assert name == "learner-policy" or read_metrics(out / name / "metrics.jsonl")
    # models.<id>.huge_pages: advised at the learner's start, before its first tensor, so in effect; and
    # models.<id>.allocator: jemalloc preloaded by the learner's re-execution at its start (restarted too)
    learner_log = (out / "learner-policy" / "process.log").read_text()
    assert "huge pages for tensors of 2 MiB or more: yes" in learner_log
    malloc = "malloc: jemalloc" if jemalloc_library() else "jemalloc: libjemalloc not found"
    assert learner_log.count(malloc) == 2, learner_log[-3000:]  # the learner and the restarted one
    assert (out / "config.yaml").read_text().count(":0\n") == 0  # children got real ports
    # held-out accuracy of the initial models and of the learner's final checkpoint, as in colocated runs
    assert "held-out accuracy before training" in output and "held-out accuracy after training" in output
    before, after = read_metrics(out / "eval" / "metrics.jsonl")  # before at step 0 (logged at the start), after at 5
    assert (before["step"], after["step"]) == (0, 5)
    assert 0 <= before["eval/accuracy_before"] <= 1 and 0 <= after["eval/accuracy_after"] <= 1


@pytest.mark.e2e
def test_launcher_stops_everything_when_a_child_cannot_be_restarted(tmp_path, smoke_model):
    out = tmp_path / "run"
    # no held-out evaluation (the test above checks it): it would cost this run a model load and a first
    # generate in the launcher before any child starts
    run = _Background(tmp_path, _drmas_run(out, "trainer.steps=1000", "pipeline.restarts.max_restarts=0",
                                           "eval.n_problems=0"))
    try:
        run.wait_for(lambda: _logged_steps(out / "learner-policy" / "metrics.jsonl") > 0, "training under way")
        run.kill_child("rollout-0")
        assert run.proc.wait(60) == 1, run.output()[-3000:]
    finally:
        run.cleanup()
    output = run.output()
    assert ("rollout-0 exited with code -9 after 0 restarts (pipeline.restarts.max_restarts=0): stopping the run"
            in output)
    assert all(_gone(pid) for pid in _pids(output).values()), output[-3000:]
    assert (out / "learner-policy" / "checkpoints").is_dir()  # the learner was stopped cleanly and saved


@pytest.mark.e2e
def test_children_of_a_sigkilled_launcher_stop_on_their_own(tmp_path, smoke_model):
    """Issue 33: buffer, learner and rollout run in sessions of their own, so after a SIGKILL of `drmas run` they
    lived on as orphans; now each notices its launcher is gone and stops as SIGTERM would stop it (the learner
    writes its checkpoint)."""
    out = tmp_path / "run"
    run = _Background(tmp_path, _drmas_run(out, "trainer.steps=1000", "eval.n_problems=0"))
    try:
        run.wait_for(lambda: _logged_steps(out / "learner-policy" / "metrics.jsonl") > 0, "training under way")
        pids = _pids(run.output())
        os.kill(run.proc.pid, signal.SIGKILL)  # the launcher alone, not its group
        run.proc.wait()
        deadline = time.monotonic() + 90
        while not all(_gone(pid) for pid in pids.values()):
            assert time.monotonic() < deadline, f"children still running: {pids}"
            time.sleep(0.5)
    finally:
        run.cleanup()
    assert set(pids) == {"buffer", "learner-policy", "rollout-0"}
    for name in pids:
        assert "the launcher that started this process" in (out / name / "process.log").read_text(), name
    learner = (out / "learner-policy" / "process.log").read_text()
    assert "stopped by the launcher's death" in learner and (out / "learner-policy" / "checkpoints").is_dir()


@pytest.mark.e2e
def test_launcher_refuses_a_missing_model_before_starting_anything(tmp_path):
    out = tmp_path / "run"
    done = run_cli(_drmas_run(out, f"models.policy.path={tmp_path / 'nowhere'}"), timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "models.policy.path" in done.stderr and "nowhere" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout and "started" not in done.stdout


@pytest.mark.e2e
@pytest.mark.timeout(720)  # the module fixture may first build both smoke_async models
def test_smoke_async_trains_two_models_one_of_them_on_two_learner_ranks(tmp_path, smoke_async_models):
    """configs/smoke_async.yaml: solver and verifier on separate models, so one learner each, and two
    rollouts; with models.solver_model.ranks=2 drmas run starts the solver's learner as 2 FSDP2 ranks under
    torchrun: rank 0 trains with the buffer and the rollouts, and its checkpoint is a plain HF directory.
    (One run for both: each `drmas run` of this config costs over a minute of the suite.)"""
    from drmas.models.checkpoint import latest_checkpoint
    from drmas.models.loading import load_model

    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke_async.yaml"),
               f"trainer.output_dir={out}", "models.solver_model.ranks=2", *ASYNC]
    done = run_cli(command, timeout=400, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(_pids(done.stdout)) == {"buffer", "learner-solver_model", "learner-verifier_model",
                                       "rollout-0", "rollout-1"}
    for model, agent in (("solver_model", "solver"), ("verifier_model", "verifier")):
        records = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in records] == [1, 2, 3]
        assert all(r[f"staleness/{agent}/max"] <= 1 for r in records)  # pipeline.max_staleness=1
        # how generation paced this model's updates, from the run's metrics (drmas.runtime.pace)
        assert re.search(rf"\[launcher\] pace of {model}: generation [\d.]+ s / update [\d.]+ s a step \(r = [\d.]+\)",
                         done.stdout), done.stdout[-3000:]
        (logged,) = read_metrics(out / "pace" / "metrics.jsonl")
        assert logged["step"] == 3 and logged[f"pace/{model}/generation_update_ratio"] > 0
    norms = [r["grad_norm/solver_model"] for r in read_metrics(out / "learner-solver_model" / "metrics.jsonl")]
    # a step may see only groups of equal rewards (zero advantages, zero gradient): not every step moves
    assert all(math.isfinite(n) and n >= 0 for n in norms) and max(norms) > 0, norms
    ckpt = latest_checkpoint(out / "learner-solver_model")
    assert '"Qwen2ForCausalLM"' in (ckpt / "solver_model" / "config.json").read_text()
    model, _ = load_model(ckpt / "solver_model")
    assert sum(p.numel() for p in model.parameters()) > 0


@pytest.mark.e2e
def test_ctrl_c_of_an_async_run_names_the_checkpoints_and_a_resume_keeps_the_score_before_training(tmp_path,
                                                                                                  smoke_model):
    """Issue 39 (9, 10): Ctrl-C printed no resume hint, and the resumed run lost its before-training score (it was
    logged only with the after one, at the end, which the stopped run never reached)."""
    out = tmp_path / "run"
    run = _Background(tmp_path, _drmas_run(out, "trainer.steps=1000", "eval.n_problems=2"))
    try:
        run.wait_for(lambda: _logged_steps(out / "learner-policy" / "metrics.jsonl") > 0, "training under way", 180)
        os.kill(run.proc.pid, signal.SIGINT)
        assert run.proc.wait(120) == 130, run.output()[-3000:]
    finally:
        run.cleanup()
    output = run.output()
    hint = re.search(r"\[launcher\] stopped by SIGINT: learner-policy at step_(\d+); continue with "
                     r"trainer\.resume=true", output)
    assert hint, output[-3000:]
    saved = int(hint.group(1))
    assert (out / "learner-policy" / "checkpoints" / f"step_{saved}" / "COMPLETE").is_file()
    before = read_metrics(out / "eval" / "metrics.jsonl")
    assert [r["step"] for r in before] == [0] and "eval/accuracy_after" not in before[0]

    done = run_cli(_drmas_run(out, f"trainer.steps={saved + 1}", "eval.n_problems=2", "trainer.resume=true"),
                   timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "held-out evaluation (before training" not in done.stdout  # not evaluated again: read back
    assert f"held-out accuracy: {before[0]['eval/accuracy_before']:.3f} -> " in done.stdout
    records = read_metrics(out / "eval" / "metrics.jsonl")
    assert [(r["step"], sorted(r)) for r in records] == [
        (0, ["eval/accuracy_before", "step", "time"]), (saved + 1, ["eval/accuracy_after", "step", "time"])]
