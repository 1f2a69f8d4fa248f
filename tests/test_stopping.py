"""Stopping a run with a signal, and resuming it: the colocated loop stops as the pipeline's processes do.

Before (issue 26): Ctrl-C printed an 80-line KeyboardInterrupt traceback and saved nothing; a SIGTERM during a
checkpoint write killed the run at once (rc 143) and left a torn step_1; `trainer.resume=true` then started
from step 0 without a word and metrics.jsonl / TensorBoard held step 1 twice; a learner told to stop trained
its whole update first (~45 s on SmolLM2) before saving.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tb_events import tensorboard_scalars
from test_policy import _samples

from drmas.colocated import ColocatedRun
from drmas.config import read_config
from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.learner.policy import PolicyTrainer, UpdateStopped
from drmas.models.loading import load_model
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
QUICK = ["eval.n_problems=0", "trainer.threads=1"]


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in read_metrics(out / "metrics.jsonl")] if (out / "metrics.jsonl").exists() else []


def _drmas_run(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={out}", *QUICK,
            *overrides]


@pytest.mark.e2e
def test_ctrl_c_stops_a_colocated_run_with_its_checkpoint_and_the_resume_logs_no_step_twice(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(_drmas_run(out, "trainer.steps=100", "logging.tensorboard=true"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while len(_steps(out)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]  # saved and stopped, not finished: as the async launcher
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    logged = _steps(out)
    step = logged[-1]
    assert logged == list(range(1, step + 1))
    assert f"stopped by SIGINT at step {step} of 100: checkpoint {out / 'checkpoints' / f'step_{step}'} saved; " \
           "continue with trainer.resume=true" in stdout
    assert (out / "checkpoints" / f"step_{step}" / "COMPLETE").is_file()

    done = subprocess.run(_drmas_run(out, f"trainer.steps={step + 1}", "logging.tensorboard=true",
                                     "trainer.resume=true"), cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / f'step_{step}'} at step {step}" in done.stdout
    assert _steps(out) == list(range(1, step + 2))
    assert [s for s, _ in tensorboard_scalars(out / "tensorboard")["loss/policy"]] == list(range(1, step + 2))


SIGNAL_MID_SAVE = """
import os, signal, sys
from drmas.models import checkpoint
written = checkpoint.sync_tree
def signalled(root):  # the checkpoint's files are written, its COMPLETE marker is not yet
    os.kill(os.getpid(), signal.SIGTERM)
    written(root)
checkpoint.sync_tree = signalled
from drmas.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.e2e
def test_sigterm_during_a_checkpoint_write_finishes_the_checkpoint_and_stops(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", SIGNAL_MID_SAVE, *_drmas_run(out, "trainer.steps=3",
                                                                                "trainer.checkpoint_interval=1",
                                                                                "logging.tensorboard=false")[3:]],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 130, done.stderr[-3000:]
    assert (out / "checkpoints" / "step_1" / "COMPLETE").is_file()
    assert f"stopped by SIGTERM at step 1 of 3: checkpoint {out / 'checkpoints' / 'step_1'} saved" in done.stdout
    assert _steps(out) == [1]


def _cfg(out: Path, *overrides: str):
    return read_config(SMOKE, [f"trainer.output_dir={out}", "logging.tensorboard=true", *QUICK, *overrides])


def _tear(out: Path, step: int) -> Path:
    """`checkpoints/step_<step>` as a save cut short leaves it: every file but the COMPLETE marker."""
    torn = out / "checkpoints" / f"step_{step}"
    if not torn.exists():
        shutil.copytree(out / "checkpoints" / "step_1", torn)
    (torn / "COMPLETE").unlink()
    return torn


def _log_extra_step(out: Path, step: int) -> None:
    """What a run killed after logging `step` and before its checkpoint leaves in its metrics.

    TensorBoard reads event files in name order, and a name is `<second>.<host>.<pid>.<n>`: within one second
    and one process `.10` sorts before `.9`. A killed run and its restart are different processes seconds
    apart; the pauses give these writers, all in this one process, the same order."""
    from drmas.runtime.metrics import MetricsWriter

    time.sleep(1.1)
    writer = MetricsWriter(out, tensorboard=True)
    writer.log(step, {"loss/policy": 123.0})
    writer.close()
    time.sleep(1.1)


@pytest.mark.e2e
def test_resume_names_the_torn_checkpoint_it_skips_or_that_there_is_none_and_never_logs_a_step_twice(tmp_path):
    out = tmp_path / "run"
    ColocatedRun(_cfg(out, "trainer.steps=1", "trainer.checkpoint_interval=1"), log=lambda *_: None).run()
    _tear(out, 2)
    _log_extra_step(out, 2)
    said: list[str] = []
    ColocatedRun(_cfg(out, "trainer.steps=2", "trainer.resume=true"), log=said.append).run()
    assert f"resuming from {out / 'checkpoints' / 'step_1'}; skipping step_2 (no COMPLETE marker: its save was cut " \
           "short)" in said
    assert _steps(out) == [1, 2]
    losses = tensorboard_scalars(out / "tensorboard")["loss/policy"]
    assert [s for s, _ in losses] == [1, 2] and losses[-1][1] != 123.0  # the resumed run's step 2

    _tear(out, 1)  # no complete checkpoint left but step_2's: tear that one too
    _tear(out, 2)
    said.clear()
    ColocatedRun(_cfg(out, "trainer.steps=1", "trainer.resume=true"), log=said.append).run()
    assert f"trainer.resume=true: no complete checkpoint in {out}; skipping step_1 (no COMPLETE marker: its save " \
           "was cut short), step_2 (no COMPLETE marker: its save was cut short): starting at step 0" in said
    assert _steps(out) == [1]


def test_an_update_asked_to_stop_abandons_before_its_first_optimizer_step_and_changes_nothing(tiny_model_dir):
    samples = _samples(tiny_model_dir)
    model, _ = load_model(tiny_model_dir)
    trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-2), AlgorithmConfig(micro_batch_size=1,
                                                                              optim_steps_per_update=2))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    asked = []

    def stop_after_one_pass() -> bool:  # asked before the later steps' log-prob pass, then before each of the
        asked.append(True)              # first step's 3 micro-batches: the signal comes during the first one
        return len(asked) > 2

    with pytest.raises(UpdateStopped):
        trainer.update(samples, np.array([1.0, -1.0] * 3), should_stop=stop_after_one_pass)
    assert trainer.optimizer_steps == 0 and not trainer.optimizer.state
    assert all(p.grad is None for p in trainer.params)
    assert all(torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    # past the first optimizer step the update finishes: the weights are a whole version
    metrics = trainer.update(samples, np.array([1.0, -1.0] * 3), should_stop=lambda: trainer.optimizer_steps > 0)
    assert trainer.optimizer_steps == 2 and metrics["grad_norm/m"] > 0
