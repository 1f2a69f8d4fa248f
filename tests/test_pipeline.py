"""The asynchronous pipeline as real processes: drmas-buffer, drmas-learner and drmas-rollout on 127.0.0.1.

Each process is started with `sys.executable -m ...` in a session of its own and SIGKILLed (whole process
group) in `finally` whatever happens. What the test asserts is read back from the metrics.jsonl files the
processes wrote, the same records TensorBoard shows.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_harness import SMOKE, Processes, smoke_model  # noqa: F401
from pipeline_harness import pipeline_overrides as _overrides

from drmas.config import read_config
from drmas.runtime.endpoints import EndpointError, learner_address, learner_endpoint, require_fixed
from drmas.runtime.metrics import read_metrics

MAX_STALENESS = 1
STEPS = 3
BUDGET_S = 90  # the whole pipeline, from starting the processes to their clean exit

# Building the primed smoke model takes minutes on 2 cores when the session cache is cold; the budget
# above is checked separately, so the timeout only has to cover that one-off build as well.
pytestmark = pytest.mark.timeout(420)


def _learn(procs: Processes, name: str, overrides: list[str], deadline: float) -> None:
    learner = procs.start(name, "drmas.learner.main", "--config", str(SMOKE), "--model", "policy", *overrides)
    try:
        assert learner.wait(max(deadline - time.monotonic(), 1)) == 0, procs.tails()
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in time\n{procs.tails()}")


def _check_buffer_accounting(out: Path, learner_steps: list[dict], version: int) -> None:
    buffer = read_metrics(out / "buffer" / "metrics.jsonl")
    for r in buffer:  # nothing silently lost, at every report
        dropped = sum(v for k, v in r.items() if k.startswith("buffer/dropped/"))
        assert r["buffer/received_samples"] == r["buffer/delivered_samples"] + dropped + r["buffer/held_samples"]
    final = buffer[-1]
    learner_dropped = sum(v for k, v in final.items() if k.startswith("buffer/learner_dropped/"))
    assert final["buffer/delivered_samples"] == sum(r["samples/policy"] for r in learner_steps) + learner_dropped
    assert final["buffer/version/policy"] == version


@pytest.mark.e2e
def test_processes_train_within_the_staleness_bound_and_a_restarted_learner_resumes(tmp_path, smoke_model):
    out = tmp_path / "run"
    overrides = _overrides(out, MAX_STALENESS, STEPS)
    procs = Processes(tmp_path)
    start = time.monotonic()
    try:
        procs.start("buffer", "drmas.buffer.main", "--config", str(SMOKE), *overrides)
        procs.start("rollout", "drmas.rollout.main", "--config", str(SMOKE), "--index", "0", *overrides)
        _learn(procs, "learner", overrides, start + BUDGET_S - 30)  # the rollout waits for its learner
        # a new learner process resumes from the checkpoint while buffer and rollout keep running
        _learn(procs, "learner-resumed", [*overrides, f"trainer.steps={STEPS + 1}", "trainer.resume=true"],
               start + BUDGET_S - 10)
        assert procs.stop("rollout", 10) == 0, procs.tails()
        assert procs.stop("buffer", 10) == 0, procs.tails()
        elapsed = time.monotonic() - start
    finally:
        procs.kill_all()
    assert elapsed < BUDGET_S

    steps = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in steps] == list(range(1, STEPS + 2))  # the resumed learner continued the numbering
    assert [r["version/policy"] for r in steps] == list(range(1, STEPS + 2))
    for r in steps:
        assert math.isfinite(r["loss/policy"]) and math.isfinite(r["grad_norm/policy"])
        assert 0 < r["ess/policy"] <= 1 and 0 <= r["idle/policy"] <= 1 and r["throughput/policy/samples_per_s"] > 0
        assert r["weight_sync/policy/receivers"] == 1  # the rollout got every version, also after the restart
        for agent in ("solver", "verifier"):
            assert 0 <= r[f"staleness/{agent}/mean"] <= r[f"staleness/{agent}/max"] <= MAX_STALENESS
            assert {f"reward/{agent}/mean", f"advantage/{agent}/sq_mean", f"valid/{agent}"} <= set(r)
    for version in (STEPS, STEPS + 1):
        assert (out / "learner-policy" / "checkpoints" / f"step_{version}" / "COMPLETE").exists()

    rollout = read_metrics(out / "rollout-0" / "metrics.jsonl")
    assert max(r["version/policy"] for r in rollout) == STEPS + 1  # new weights were swapped in
    assert max(r["throughput/rollout/tokens_per_s"] for r in rollout) > 0
    _check_buffer_accounting(out, steps, STEPS + 1)


def _poison(group: str, kind: str):
    """A well-formed sample the buffer passes with `validate_samples=false` but the model cannot take."""
    from drmas.core.sample import Sample

    prompt, response, logprobs = [1, 2, 3], [4, 5], [-0.5, -0.5]
    if kind == "bad_token":
        response = [4, 10**6]  # past the tiny model's vocabulary: IndexError in the embedding
    elif kind == "too_long":
        prompt = [7] * 3000  # past the tiny model's 2048 positions
    elif kind == "non_finite":
        logprobs = [-0.5, math.nan]
    episode_id = f"{group}/e0"
    return episode_id, [Sample(episode_id=episode_id, group_id=group, agent="solver", model="policy", turn=0,
                               prompt_ids=prompt, response_ids=response, behaviour_logprobs=logprobs,
                               policy_version=0, temperature=1.0, valid=True, reward=1.0)]


@pytest.mark.e2e
def test_strictly_on_policy_training_goes_on_through_bad_messages_and_samples_the_model_cannot_take(tmp_path,
                                                                                                  smoke_model):
    """pipeline.max_staleness=0 trains only on samples of the current weights. Meanwhile random bytes, a
    wrong schema and an oversized message hit the live buffer from a rogue client; the buffer rejects and
    counts each. And a token id past the vocabulary, a prompt past the positions and a NaN log-prob reach the
    learner (with validate_samples=false the buffer checks only routing fields); each used to end the
    learner and with it the run, now each is dropped and counted. The rollout and learner train through all
    of it. (One pipeline for the three: each costs ~15-20 s.)"""
    import msgspec
    import zmq

    from drmas.buffer import BufferProducer

    out = tmp_path / "run"
    overrides = [*_overrides(out, 0, 2), "pipeline.buffer.max_message_bytes=200000",
                 "pipeline.buffer.validate_samples=false"]
    producer = next(o.split("=", 1)[1] for o in overrides if o.startswith("pipeline.buffer.producer_endpoint="))
    procs = Processes(tmp_path)
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    kinds = ("bad_token", "too_long", "non_finite")
    try:
        procs.start("buffer", "drmas.buffer.main", "--config", str(SMOKE), *overrides)
        rogue.connect(producer)
        for payload in (os.urandom(512), msgspec.msgpack.encode({"type": "Episode", "nonsense": [1, 2]}),
                        b"\x00" * 300_000):
            rogue.send(payload)
        with BufferProducer(producer, "poisoner", timeout_s=30) as poisoner:
            for kind in kinds:  # queued first, so the learner's first pull meets them
                poisoner.send_episode(f"poison-{kind}", 1, *_poison(f"poison-{kind}", kind))
            poisoner.flush()
            assert poisoner.pop_rejections() == []
        procs.start("rollout", "drmas.rollout.main", "--config", str(SMOKE), *overrides)
        _learn(procs, "learner", overrides, time.monotonic() + BUDGET_S)
        assert procs.stop("rollout", 10) == 0 and procs.stop("buffer", 10) == 0, procs.tails()
    finally:
        rogue.close()
        context.term()
        procs.kill_all()
    steps = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    assert all(r[f"staleness/{agent}/max"] == 0 for r in steps for agent in ("solver", "verifier"))
    assert all(steps[0].get(f"dropped/policy/{kind}") == 1 for kind in kinds), steps[0]
    final = read_metrics(out / "buffer" / "metrics.jsonl")[-1]
    rejected = {k.removeprefix("buffer/rejected/"): v for k, v in final.items() if k.startswith("buffer/rejected/")}
    assert rejected.get("oversized", 0) >= 1, rejected
    assert sum(rejected.values()) >= 3, rejected
    assert all(final[f"buffer/learner_dropped/{kind}"] == 1 for kind in kinds)
    _check_buffer_accounting(out, steps, 2)


def test_endpoints_follow_the_config_and_port_zero_is_refused_outside_the_launcher():
    cfg = read_config(SMOKE, ["models.judge={builtin: tiny}", "agents.verifier.model=judge",
                              "pipeline.learner_base_port=7000", "pipeline.learner_hosts={judge: 10.0.0.2}",
                              "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:5601",
                              "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:5602"])
    assert learner_address(cfg, "policy") == ("127.0.0.1", 7000)
    assert learner_endpoint(cfg, "judge") == "tcp://10.0.0.2:7001"
    require_fixed(cfg, buffer=True, learners=["policy", "judge"])
    cfg = read_config(SMOKE, ["pipeline.learner_base_port=0", "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0"])
    with pytest.raises(EndpointError, match="pipeline.buffer.consumer_endpoint"):
        require_fixed(cfg, buffer=True)
    with pytest.raises(EndpointError, match="policy"):
        require_fixed(cfg, learners=["policy"])
