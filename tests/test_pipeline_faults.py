"""Faults of the asynchronous pipeline, as real processes started by hand (no launcher to stop them).

One learner trains while rollout processes die and join: `kill -9` of a rollout mid-run must not stop or
hang the learner; a rollout started late must receive the learner's current weights, which shows in its
behaviour log-probs: on samples generated with the learner's current version they equal the learner's own
log-probs of the same tokens (`logp_diff/<model>/<producer>`, computed by the learner on every update).
Then the learner itself is killed with `kill -9` and restarted with resume: it continues from its last
checkpoint's version and the surviving rollout re-joins it.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import time

import pytest
from pipeline_harness import SMOKE, Processes, pipeline_overrides, smoke_model  # noqa: F401

from drmas.runtime.metrics import read_metrics

STEPS = 8
KILL_LEARNER_AT = 6
MAX_STALENESS = 1
BUDGET_S = 180

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]


def _wait_for_step(procs: Processes, metrics_path, step: int, deadline: float) -> None:
    """Block until the learner has logged `step` (or fail with every process's log tail)."""
    while time.monotonic() < deadline:
        if metrics_path.exists():
            records = read_metrics(metrics_path)
            if records and records[-1]["step"] >= step:
                return
        if procs.procs["learner"].poll() is not None:
            pytest.fail(f"the learner exited before step {step}\n{procs.tails()}")
        time.sleep(0.2)
    pytest.fail(f"the learner did not reach step {step} in time\n{procs.tails()}")


def _kill9(procs: Processes, name: str) -> None:
    os.killpg(procs.procs[name].pid, signal.SIGKILL)
    procs.procs[name].wait(10)


def test_learner_survives_killed_rollouts_and_a_late_rollout_serves_its_current_weights(tmp_path, smoke_model):
    out = tmp_path / "run"
    overrides = [*pipeline_overrides(out, MAX_STALENESS, STEPS), "pipeline.groups_in_flight=2",
                 "pipeline.buffer.producer_timeout_s=3", "trainer.checkpoint_interval=1"]
    metrics = out / "learner-policy" / "metrics.jsonl"
    procs = Processes(tmp_path)
    deadline = time.monotonic() + BUDGET_S
    try:
        procs.start("buffer", "drmas.buffer.main", "--config", str(SMOKE), *overrides)
        for i in (0, 1):
            procs.start(f"rollout-{i}", "drmas.rollout.main", "--config", str(SMOKE), "--index", str(i), *overrides)
        learner = procs.start("learner", "drmas.learner.main", "--config", str(SMOKE), "--model", "policy", *overrides)
        _wait_for_step(procs, metrics, 2, deadline)
        _kill9(procs, "rollout-1")  # mid-run, possibly mid-episode and mid-group
        _wait_for_step(procs, metrics, 4, deadline)  # the learner kept stepping on rollout-0's groups
        _kill9(procs, "rollout-0")  # now nobody produces: the learner waits (and must not die)
        procs.start("rollout-2", "drmas.rollout.main", "--config", str(SMOKE), "--index", "2", *overrides)
        _wait_for_step(procs, metrics, KILL_LEARNER_AT, deadline)
        _kill9(procs, "learner")  # mid-run: the step after its last checkpoint may be lost, nothing else
        learner = procs.start("learner-resumed", "drmas.learner.main", "--config", str(SMOKE), "--model", "policy",
                              *overrides, "trainer.resume=true")
        try:
            assert learner.wait(max(deadline - time.monotonic(), 1)) == 0, procs.tails()
        except subprocess.TimeoutExpired:
            pytest.fail(f"the resumed learner did not finish in time\n{procs.tails()}")
        assert procs.stop("rollout-2", 10) == 0, procs.tails()
        assert procs.stop("buffer", 10) == 0, procs.tails()
    finally:
        procs.kill_all()

    steps = read_metrics(metrics)
    numbers = [r["step"] for r in steps]
    resumed_at = int(re.search(r"resumed from \S+ at version (\d+)", procs.tail("learner-resumed", 200)).group(1))
    # checkpoints follow the metrics of each step, so the last logged step may not be saved yet
    assert KILL_LEARNER_AT - 1 <= resumed_at < STEPS
    # steps 1..8 in order through both rollout kills and the learner kill; a step logged after the last
    # checkpoint may appear twice (trained again after the restart), nothing is skipped
    assert numbers == sorted(numbers) and set(numbers) == set(range(1, STEPS + 1))
    assert numbers[-(STEPS - resumed_at):] == list(range(resumed_at + 1, STEPS + 1))
    assert all(math.isfinite(r["loss/policy"]) for r in steps)
    # the dead rollouts left the weight-sync group; the late one joined it
    assert steps[-1]["weight_sync/policy/receivers"] == 1
    assert sum(r["weight_sync/policy/dropped"] for r in steps) <= 2

    # every on-policy sample of every producer, in every step, was generated with exactly the learner's
    # weights -- also after the learner restart, when samples of the versions the killed learner published
    # after its last checkpoint carry the numbers the resumed learner reuses (they are dropped as orphans)
    diffs = [(r["step"], k, v) for r in steps for k, v in r.items() if k.startswith("logp_diff/policy/")]
    assert diffs and max(v for _, _, v in diffs) < 1e-3, diffs
    late = [r["logp_diff/policy/rollout-2"] for r in steps if "logp_diff/policy/rollout-2" in r]
    assert late, f"no on-policy sample of the late rollout was trained on: {diffs}"
    assert max(late) < 1e-3

    late_versions = [r["version/policy"] for r in read_metrics(out / "rollout-2" / "metrics.jsonl")]
    assert min(late_versions) >= 4  # it started from the weights current when it joined, not the initial ones

    final = read_metrics(out / "buffer" / "metrics.jsonl")[-1]
    dropped = sum(v for k, v in final.items() if k.startswith("buffer/dropped/"))
    assert final["buffer/received_samples"] == final["buffer/delivered_samples"] + dropped + final["buffer/held_samples"]
