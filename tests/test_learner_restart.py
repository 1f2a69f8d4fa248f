"""One learner of two is killed with kill -9 and restarted with resume: the run must still finish.

configs/smoke_async.yaml trains solver and verifier on separate models, so each has a learner, and every
group feeds both. When the verifier's learner restarts behind its peer (at version 0 without a checkpoint,
or at a checkpoint older than the version it had published), the buffer used to keep counting the groups
the dead learner had consumed against the new one, and the solver's learner, once finished, held the grant
at zero for good: the run hung. Processes are started by hand (no launcher) on free loopback ports and always killed.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from pipeline_harness import SMOKE_ASYNC, Processes, pipeline_overrides, smoke_async_models  # noqa: F401

from drmas.runtime.metrics import read_metrics

STEPS = 4
KILL_AT = 3  # the verifier's learner is killed once it logged this step; with checkpoints every 2 steps it
             # resumes at version 2, behind what it had published (the step-3 metrics follow the step-2
             # checkpoint, and there is no checkpoint of step 3)
BUDGET_S = 240

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _last_step(path) -> int:
    records = read_metrics(path) if path.exists() else []
    return records[-1]["step"] if records else 0


def _wait(procs: Processes, condition, what: str, deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached in time\n{procs.tails()}")
        time.sleep(0.2)


@pytest.mark.parametrize("checkpoint_interval", [0, 2], ids=["no-checkpoint", "checkpoint-behind"])
def test_a_restarted_learner_of_two_lets_the_run_finish(tmp_path, smoke_async_models, checkpoint_interval):
    out = tmp_path / "run"
    overrides = [*pipeline_overrides(out, 1, STEPS, models=("solver_model", "verifier_model")),
                 f"trainer.checkpoint_interval={checkpoint_interval}", "pipeline.buffer.producer_timeout_s=3"]
    config = ["--config", str(SMOKE_ASYNC)]
    solver = out / "learner-solver_model" / "metrics.jsonl"
    verifier = out / "learner-verifier_model" / "metrics.jsonl"
    procs = Processes(tmp_path)
    deadline = time.monotonic() + BUDGET_S
    try:
        procs.start("buffer", "drmas.buffer.main", *config, *overrides)
        procs.start("rollout-0", "drmas.rollout.main", *config, "--index", "0", *overrides)
        procs.start("learner-solver", "drmas.learner.main", *config, "--model", "solver_model", *overrides)
        procs.start("learner-verifier", "drmas.learner.main", *config, "--model", "verifier_model", *overrides)
        _wait(procs, lambda: _last_step(verifier) >= KILL_AT, f"verifier step {KILL_AT}", deadline)
        procs.kill9("learner-verifier")
        # let the solver's learner run ahead as far as the dead verifier's budget allows
        _wait(procs, lambda: _last_step(solver) > KILL_AT, "the solver ahead of the killed verifier", deadline)
        procs.start("learner-verifier-resumed", "drmas.learner.main", *config, "--model", "verifier_model",
                    *overrides, "trainer.resume=true")
        for name in ("learner-solver", "learner-verifier-resumed"):
            try:
                assert procs.procs[name].wait(max(deadline - time.monotonic(), 1)) == 0, procs.tails()
            except subprocess.TimeoutExpired:
                pytest.fail(f"{name} did not finish: the run hangs\n{procs.tails()}")
        assert procs.stop("rollout-0", 10) == 0, procs.tails()
        assert procs.stop("buffer", 10) == 0, procs.tails()
    finally:
        procs.kill_all()

    resumed_log = procs.tail("learner-verifier-resumed", 300)
    if checkpoint_interval:
        resumed_at = int(re.search(r"resumed from \S+ at version (\d+)", resumed_log).group(1))
        assert resumed_at == 2, resumed_log[-2000:]
    else:
        assert "starting at version 0" in resumed_log
    assert _last_step(solver) == STEPS and _last_step(verifier) == STEPS
    final = read_metrics(out / "buffer" / "metrics.jsonl")[-1]
    dropped = sum(v for k, v in final.items() if k.startswith("buffer/dropped/"))
    assert final["buffer/received_samples"] == final["buffer/delivered_samples"] + dropped + final["buffer/held_samples"]
