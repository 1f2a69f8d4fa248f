"""eval.interval in the asynchronous pipeline: rollout 0 evaluates the newest weights while training goes on.

The colocated loop's evaluations are tested in test_colocated.py; the schedule here, and a real `drmas run`
(buffer, learner, rollout processes) whose evaluations reach evals.jsonl and TensorBoard and never the buffer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from tb_events import tensorboard_scalars

from drmas import assembly
from drmas.config import ConfigError, read_config
from drmas.evaluation.async_heldout import final_interval_eval
from drmas.evaluation.evals_log import EVALS_FILE, EvalLog
from drmas.evaluation.interval import IntervalSchedule
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"

ASYNC = [
    "pipeline.mode=async", "pipeline.num_rollouts=1", "pipeline.learner_base_port=0", "trainer.threads=1",
    "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0", "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0",
    "pipeline.report_interval_s=0.5", "pipeline.weights.timeout_s=10", "pipeline.weights.ready_timeout_s=10",
    "pipeline.weights.join_retry_s=0.2", "pipeline.weights.heartbeat_s=0.25", "pipeline.weights.peer_timeout_s=3",
]


def test_schedule_takes_every_nth_version_and_catches_up_on_a_missed_one():
    schedule = IntervalSchedule(3)
    assert schedule.due(0)  # the first version seen: the curve's starting point
    schedule.started(0)
    assert [v for v in range(1, 7) if schedule.due(v)] == [3, 4, 5, 6]
    schedule.started(4)  # version 3 was never seen (an evaluation ran through it): 4 is taken instead
    assert not schedule.due(5) and schedule.due(6)
    resumed = IntervalSchedule(3, done=6)  # evals.jsonl of a resumed run ends at 6
    assert not resumed.due(6) and not resumed.due(8) and resumed.due(9)
    assert not any(IntervalSchedule(0).due(v) for v in range(5))  # 0: off


def test_a_negative_interval_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"eval\.interval: must be >= 0"):
        read_config(SMOKE, ["eval.interval=-1"])


def test_evals_jsonl_is_made_by_the_first_evaluation_not_by_opening_the_log(tmp_path):
    """Every colocated run opens its EvalLog; one without eval.interval must not leave an empty evals.jsonl."""
    EvalLog(tmp_path, tensorboard=False).close()
    assert not (tmp_path / EVALS_FILE).exists()
    evals = EvalLog(tmp_path, tensorboard=False)
    report = {"version": 0, "step": 0, "benchmarks": {}, "behaviour": {}}
    evals.write(report)
    evals.close()
    resumed = EvalLog(tmp_path, tensorboard=False, resumed_at=0)  # a resume keeps the records up to its step
    resumed.close()
    assert resumed.done == 0 and read_metrics(tmp_path / EVALS_FILE) == [report]


@pytest.mark.e2e
@pytest.mark.timeout(420)  # covers a cold build of the smoke model; the run has its own limit
def test_async_run_evaluates_while_training_and_its_samples_never_reach_the_buffer(tmp_path):
    assembly.model_path(read_config(SMOKE), "policy")  # built once here, not by every child
    out = tmp_path / "run"
    done = run_cli([sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={out}",
                    *ASYNC, "trainer.steps=3", "eval.n_problems=0", "eval.interval=1", "eval.k=2",
                    "eval.max_questions=1", "logging.tensorboard=true"], timeout=240, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = [json.loads(line) for line in (out / "eval" / "evals.jsonl").read_text().splitlines()]
    versions = [r["version"] for r in records]
    assert versions[0] == 0 and versions[-1] == 3 and versions == sorted(set(versions)), versions
    for r in records:
        score = r["benchmarks"]["arithmetic"]
        assert score["k"] == 2 and score["n_questions"] == 1 and 0 <= score["avg@k"] <= score["pass@k"] <= 1
        assert r["behaviour"]["arithmetic"]["episodes"] == 2 and "approved" in r["behaviour"]["arithmetic"]["info"]
        low, high = r["versions"]["policy"]
        assert r["version"] <= low <= high <= 3  # made by the weights it names, or newer ones pushed meanwhile
    assert "eval at version 0: arithmetic avg@2" in (out / "rollout-0" / "process.log").read_text()
    scalars = tensorboard_scalars(out / "eval" / "tensorboard")
    assert [step for step, _ in scalars["eval/arithmetic/avg@k"]] == versions
    assert [step for step, _ in scalars["eval/arithmetic/calls_per_episode/solver"]] == versions

    # the evaluation's samples were made beside the training ones and never sent: the buffer received at most
    # what the rollout made for training (the rollout stops first, so its last record counts every sample)
    rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")[-1]
    buffer = read_metrics(out / "buffer" / "metrics.jsonl")[-1]
    assert rollout["rollout/eval_samples"] >= 2 * len([v for v in versions if v < 3])  # rollout 0 made those
    assert 0 < buffer["buffer/received_samples"] <= rollout["rollout/samples_made"] - rollout["rollout/eval_samples"]
    # and the evaluating rollout took every push: no learner step lost it
    learner = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["weight_sync/policy/receivers"] for r in learner] == [1, 1, 1]

    # the final version, when rollout 0 was stopped before it evaluated it: the launcher's evaluation of the
    # learner's last checkpoint (run here in-process on the same run directory) adds it
    evals = out / "eval" / "evals.jsonl"
    evals.write_text("".join(line + "\n" for line in evals.read_text().splitlines() if json.loads(line)["version"] < 3))
    cfg = read_config(out / "config.yaml", ["logging.tensorboard=false"])
    report = final_interval_eval(cfg, assembly.build_task(cfg))
    assert report["version"] == 3 and report["versions"] == {"policy": [3, 3]}
    assert [json.loads(line)["version"] for line in evals.read_text().splitlines()][-1] == 3
    assert final_interval_eval(cfg, assembly.build_task(cfg)) is None  # evaluated already: not again
