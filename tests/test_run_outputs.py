"""What a run leaves on disk: durable checkpoints, output directories that are never mixed up, process logs,
and the restart policy that decides when a dead pipeline process comes back."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cli_run import run_cli

from drmas.runtime.restarts import EXIT_USAGE, RestartBook, RestartConfig
from drmas.models import checkpoint
from drmas.runtime.run_dir import OutputDirError, claim_output_dir

ROOT = Path(__file__).resolve().parents[1]


def test_checkpoint_is_durable_before_its_complete_marker(tmp_path, tiny_model, monkeypatch):
    """Every file and directory of a checkpoint reaches the disk (fsync) before COMPLETE is written, and
    COMPLETE itself after; a marker written first could vouch for weights a power loss never saved."""
    synced: list[Path] = []
    real_fsync = os.fsync
    target = checkpoint.checkpoint_dir(tmp_path, 3)

    def spying_fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if target / "COMPLETE" not in synced and path != target / "COMPLETE":
            assert not (target / "COMPLETE").exists(), f"COMPLETE written before {path} was synced"
        synced.append(path)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spying_fsync)
    model, tokenizer = tiny_model
    path = checkpoint.save_checkpoint(tmp_path, 3, {"policy": (model, tokenizer)}, {"policy": {"x": 1}},
                                      {"step": 3})
    assert path == target and checkpoint.latest_checkpoint(tmp_path) == target
    written = {p for p in target.rglob("*")} | {target}
    assert written <= set(synced), sorted(written - set(synced))
    marker = synced.index(target / "COMPLETE")
    # everything else first (DCP's writer also fsyncs the trainer-state files it writes, each rank its own,
    # before the pass over the whole tree)
    assert written - {target / "COMPLETE"} <= set(synced[:marker])
    assert target / "trainer_state" / "policy" / ".metadata" in written
    assert synced[marker + 1:] == [target, target.parent]  # then the marker's directory entries


def test_keep_checkpoints_deletes_all_but_the_newest_complete_ones(tmp_path, tiny_model):
    """trainer.keep_checkpoints=2 over five saves: the newest two stay and resume from the newest; a torn save
    older than them goes too, one newer than them (the next save's directory) is left alone."""
    model, tokenizer = tiny_model
    torn_old, torn_new = checkpoint.checkpoint_dir(tmp_path, 2), checkpoint.checkpoint_dir(tmp_path, 9)
    for torn in (torn_old, torn_new):
        (torn / "policy").mkdir(parents=True)  # a save killed before its marker
    for step in (1, 3, 4, 5, 6):
        checkpoint.save_checkpoint(tmp_path, step, {"policy": (model, tokenizer)}, {"policy": {"x": step}},
                                   {"step": step}, keep=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_5", "step_6", "step_9"]
    assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_dir(tmp_path, 6)
    assert checkpoint.load_run_state(checkpoint.checkpoint_dir(tmp_path, 5)) == {"step": 5}  # whole, loadable
    checkpoint.save_checkpoint(tmp_path, 7, {"policy": (model, tokenizer)}, {"policy": {"x": 7}}, {"step": 7})
    assert len(list((tmp_path / "checkpoints").iterdir())) == 4  # keep=0 (the default) deletes nothing


def test_an_output_dir_holding_a_run_is_refused_unless_resuming_or_overwriting(tmp_path):
    run = tmp_path / "run"
    assert claim_output_dir(run, resume=False, overwrite=False) == run and run.is_dir()  # new: created
    assert claim_output_dir(run, resume=False, overwrite=False) == run  # empty: fine
    (run / "config.yaml").write_text("x: 1\n")
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(OutputDirError, match=r"trainer.output_dir=.*already holds a run \(config.yaml, "
                                             r"metrics.jsonl\).*trainer.resume=true.*trainer.overwrite=true"):
        claim_output_dir(run, resume=False, overwrite=False)
    claim_output_dir(run, resume=True, overwrite=False)
    assert (run / "metrics.jsonl").exists()  # resuming keeps everything
    claim_output_dir(run, resume=False, overwrite=True)
    assert run.is_dir() and not any(run.iterdir())  # overwriting starts from an empty directory

    home_like = tmp_path / "home"
    home_like.mkdir()
    (home_like / "thesis.tex").write_text("precious")
    with pytest.raises(OutputDirError, match="does not look like a drmas run"):
        claim_output_dir(home_like, resume=False, overwrite=True)
    assert (home_like / "thesis.tex").read_text() == "precious"
    with pytest.raises(OutputDirError, match="is a file"):
        claim_output_dir(home_like / "thesis.tex", resume=False, overwrite=False)


@pytest.mark.e2e
def test_a_second_run_into_the_same_directory_is_refused_with_a_message(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / "smoke.yaml"),
               f"trainer.output_dir={out}", "trainer.steps=1", "eval.n_problems=0", "logging.tensorboard=false",
               "trainer.threads=1"]
    first = run_cli(command, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-2000:]
    metrics = (out / "metrics.jsonl").read_text()
    second = run_cli(command, timeout=300, cwd=ROOT)
    assert second.returncode == 2 and "already holds a run" in second.stderr and "Traceback" not in second.stderr
    assert (out / "metrics.jsonl").read_text() == metrics  # untouched
    third = run_cli([*command, "trainer.overwrite=true"], timeout=300, cwd=ROOT)
    assert third.returncode == 0, third.stderr[-2000:]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1  # one run's step, not two


def test_restart_policy_backs_off_gives_up_and_never_retries_a_refused_input():
    book = RestartBook(RestartConfig(max_restarts=3, backoff_s=2.0, max_backoff_s=5.0))
    decisions = [book.after_exit("rollout-0", -9) for _ in range(4)]
    assert [(d.restart, d.delay_s, d.attempt) for d in decisions[:3]] == [(True, 2.0, 1), (True, 4.0, 2),
                                                                          (True, 5.0, 3)]
    assert not decisions[3].restart and "after 3 restarts" in decisions[3].why
    assert book.after_exit("rollout-1", 1).restart  # counted per process
    refused = book.after_exit("learner-policy", EXIT_USAGE)
    assert not refused.restart and "refused its input" in refused.why
    assert not RestartBook(RestartConfig(max_restarts=0)).after_exit("buffer", -9).restart
    with pytest.raises(ValueError, match="pipeline.restarts.max_restarts"):
        RestartBook(RestartConfig(max_restarts=-1))
