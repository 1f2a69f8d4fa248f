"""Colocated training on a tiny model: real episodes, real gradients, weights pushed into the engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tb_events import tensorboard_scalars

from drmas.colocated import ColocatedRun
from drmas.config import read_config
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"


def _cfg(tmp_path, *overrides):
    return read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'run'}", "logging.tensorboard=false", *overrides])


@pytest.mark.e2e
def test_steps_change_weights_and_engine_follows(tmp_path):
    run = ColocatedRun(_cfg(tmp_path, "trainer.steps=2", "eval.n_problems=0"), log=lambda *_: None)
    trainer = run.trainers["policy"]
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    run.run()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert not (tmp_path / "run" / "evals.jsonl").exists()  # no eval.interval: no evaluation, no empty file
    for r in records:
        assert np.isfinite(r["loss/policy"]) and np.isfinite(r["grad_norm/policy"])
        assert {"reward/solver/mean", "advantage/solver/sq_mean", "valid/verifier", "mismatch_kl/policy"} <= set(r)
        # the math system's episode info, averaged over the step's episodes (booleans as rates)
        assert r["episode/info/rounds"] >= 1 and 0 <= r["episode/info/approved"] <= 1
        assert r["episode/count"] == 8 and 0 <= r["episode/reward_mean"] <= 1  # 2 prompts x 4 episodes
    # the format-primed smoke model writes both agents' formats, so rewards vary and gradients flow
    # (weight decay alone would change the weights, so "weights changed" is not enough)
    assert max(r["grad_norm/policy"] for r in records) > 0
    assert max(r["valid/solver"] for r in records) > 0 and max(r["valid/verifier"] for r in records) > 0
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight changed"
    engine = run.engines["policy"]
    assert engine.version == 2
    engine_weights = dict(engine.model.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.equal(engine_weights[name].data, p.data), f"engine has stale {name}"


@pytest.mark.e2e
def test_running_reward_statistics_reach_tensorboard_and_the_summary(tmp_path, capsys):
    from drmas.runtime.report import print_summary

    cfg = read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'run'}", "logging.tensorboard=true", "trainer.steps=2",
                              "eval.n_problems=0", "models.policy.tiny.prime_steps=0"])
    run = ColocatedRun(cfg, log=lambda *_: None)
    summary = run.run()
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    for agent in ("solver", "verifier"):
        counts = [value for _, value in scalars[f"reward_stats/{agent}/count"]]
        assert len(counts) == 2 and 0 < counts[0] < counts[1] == run.stats.count(agent)
        assert scalars[f"reward_stats/{agent}/mean"][-1] == (2, pytest.approx(run.stats.mean(agent)))
        assert f"reward_stats/{agent}/std" in scalars
        assert summary["reward_stats"][agent]["count"] == counts[-1]
    print_summary(summary, cfg)
    printed = capsys.readouterr().out
    assert "running reward (solver) mean / std / count" in printed and "running reward (verifier)" in printed


@pytest.mark.e2e
def test_eval_interval_scores_every_version_between_steps_without_changing_training(tmp_path):
    """eval.interval=1: versions 0, 1, 2 are evaluated (avg@k / pass@k, per-agent statistics) into evals.jsonl and
    TensorBoard at their version; the training steps are those of a run without evaluations."""
    quick = ["trainer.steps=2", "eval.n_problems=0", "eval.k=2", "eval.max_questions=1", "models.policy.tiny.prime_steps=0"]
    plain = ColocatedRun(_cfg(tmp_path / "plain", *quick), log=lambda *_: None)
    plain.run()
    lines = []
    cfg = read_config(SMOKE, [f"trainer.output_dir={tmp_path / 'run'}", "logging.tensorboard=true", *quick,
                              "eval.interval=1"])
    ColocatedRun(cfg, log=lines.append).run()
    records = [json.loads(line) for line in (tmp_path / "run" / "evals.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records] == [0, 1, 2]
    for r in records:
        assert r["versions"] == {"policy": [r["version"], r["version"]]}  # one version per evaluation
        score = r["benchmarks"]["arithmetic"]
        assert score["k"] == 2 and score["n_questions"] == 1 and 0 <= score["avg@k"] <= score["pass@k"] <= 1
        behaviour = r["behaviour"]["arithmetic"]
        assert behaviour["episodes"] == 2 and behaviour["agents"]["solver"]["calls_per_episode"] >= 1
        assert "approved" in behaviour["info"]
    assert any(line.startswith("eval at version 2: arithmetic avg@2") for line in lines)
    scalars = tensorboard_scalars(tmp_path / "run" / "tensorboard")
    assert [step for step, _ in scalars["eval/arithmetic/avg@k"]] == [0, 1, 2]
    assert [value for _, value in scalars["eval/arithmetic/pass@k"]] == [r["benchmarks"]["arithmetic"]["pass@k"]
                                                                         for r in records]
    assert [step for step, _ in scalars["eval/arithmetic/calls_per_episode/verifier"]] == [0, 1, 2]
    # the evaluations draw no problem, touch no statistic and no sampling stream of the training steps
    trained = read_metrics(tmp_path / "run" / "metrics.jsonl")
    for a, b in zip(read_metrics(tmp_path / "plain" / "run" / "metrics.jsonl"), trained, strict=True):
        assert (a["step"], a["loss/policy"], a["reward/solver/mean"]) == (b["step"], b["loss/policy"],
                                                                          b["reward/solver/mean"])


@pytest.mark.e2e
def test_engine_logprobs_match_learner_on_same_weights(tmp_path):
    """Behaviour log-probs (engine, incremental KV cache) vs the learner's padded recomputation."""
    run = ColocatedRun(_cfg(tmp_path, "trainer.steps=1", "eval.n_problems=0"), log=lambda *_: None)
    run.run()  # after one update the engine serves the new weights
    from drmas.episodes import EpisodeRequest

    problems = run.sampler.next(3)
    results = run.runner.run([EpisodeRequest(f"x{i}", f"x{i}", p) for i, p in enumerate(problems)])
    samples = [s for r in results for s in r.samples]
    assert all(s.policy_version == 1 for s in samples)
    learner = run.trainers["policy"].logprobs(samples)
    diff = max(float((lp - torch.tensor(s.behaviour_logprobs)).abs().max()) for lp, s in zip(learner, samples))
    assert diff < 1e-4, f"engine and learner log-probs differ by {diff}"


@pytest.mark.e2e
def test_separate_models_per_agent(tmp_path):
    cfg = _cfg(
        tmp_path, "trainer.steps=1", "eval.n_problems=0",
        "models.verifier_model={builtin: tiny, tiny: {seed: 1}}", "agents.verifier.model=verifier_model",
    )
    run = ColocatedRun(cfg, log=lambda *_: None)
    assert set(run.trainers) == {"policy", "verifier_model"}
    run.run()
    record = read_metrics(tmp_path / "run" / "metrics.jsonl")[-1]
    assert np.isfinite(record["grad_norm/policy"]) and np.isfinite(record["grad_norm/verifier_model"])


@pytest.mark.e2e
def test_resume_continues_exactly_like_an_uninterrupted_run(tmp_path):
    quiet = dict(log=lambda *_: None)
    ColocatedRun(_cfg(tmp_path, "trainer.steps=2", "trainer.checkpoint_interval=1", "eval.n_problems=0"), **quiet).run()
    resumed = ColocatedRun(_cfg(tmp_path, "trainer.steps=3", "trainer.resume=true", "eval.n_problems=0"), **quiet)
    resumed.run()
    assert resumed.step == 3 and resumed.engines["policy"].version == 3
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3]
    assert resumed.sampler.drawn == 3 * 2  # prompts_per_step=2: the sampler position was restored

    straight_dir = tmp_path / "straight"
    ColocatedRun(read_config(SMOKE, [f"trainer.output_dir={straight_dir}", "logging.tensorboard=false",
                                     "trainer.steps=3", "eval.n_problems=0"]), **quiet).run()
    straight = read_metrics(straight_dir / "metrics.jsonl")[-1]
    for key in ("reward/solver/mean", "advantage/solver/sq_mean", "loss/policy", "grad_norm/policy"):
        assert records[-1][key] == pytest.approx(straight[key], rel=1e-4, abs=1e-6), key


@pytest.mark.e2e
def test_cli_run_writes_output_layout(tmp_path):
    out = tmp_path / "cli"
    proc = subprocess.run(
        [sys.executable, "-m", "drmas.cli", "run", "--config", str(SMOKE), f"trainer.output_dir={out}"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "held-out accuracy: before" in proc.stdout
    assert (out / "config.yaml").is_file()
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if "loss/policy" in r] == [1, 2, 3]
    assert {"eval/accuracy_before", "eval/accuracy_after"} <= {k for r in records for k in r}
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = out / "checkpoints" / "step_3" / "policy"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(ckpt)  # a plain HF directory
    assert json.loads((ckpt / "config.json").read_text())["model_type"]


def test_missing_model_path_is_named(tmp_path, capsys):
    from drmas.cli import main

    missing = tmp_path / "no_such_model"
    code = main(["run", "--config", str(SMOKE), f"trainer.output_dir={tmp_path}",
                 "models.policy.builtin=null", f"models.policy.path={missing}"])
    assert code == 2
    assert str(missing) in capsys.readouterr().err
