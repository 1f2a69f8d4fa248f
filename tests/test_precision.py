"""The precision contract (`models.<id>.compute_dtype`, `drmas.models.devices`) on CPU: the engine generates in
the dtype the learner computes in, pushes carry that dtype (bfloat16: half the bytes of float32), and the
on-policy gap between the two sides' log-probs is tight in float32."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from drmas import assembly
from drmas.config import ConfigError, read_config
from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.engines.base import SamplingParams
from drmas.engines.embedded import EmbeddedEngine
from drmas.learner.policy import PolicyTrainer
from drmas.models.loading import load_model
from drmas.core.sample import Sample
from drmas.config.weights import WeightSyncConfig
from drmas.weights import WeightReceiver, WeightSender

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"


def _samples(engine: EmbeddedEngine, n: int = 6) -> list[Sample]:
    prompts = [engine.tokenizer(f"question {i}: how many apples are left?")["input_ids"] for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(max_new_tokens=12, seed=i) for i in range(n)])
    return [Sample(episode_id=f"e{i}", group_id="r-x-g0", agent="solver", model="m", turn=0, prompt_ids=p,
                   response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0, temperature=1.0,
                   valid=True) for i, (p, g) in enumerate(zip(prompts, gens))]


def _gap(trainer: PolicyTrainer, samples: list[Sample]) -> float:
    learner = trainer.logprobs(samples)
    return max(float((lp - torch.as_tensor(s.behaviour_logprobs)).abs().max()) for lp, s in zip(learner, samples))


def test_compute_dtype_is_what_the_engine_holds_and_the_learner_computes_in(tiny_model_dir: Path) -> None:
    """float32 (the default): both sides in float32, gap ~1e-6. bfloat16: a bfloat16 engine, a float32
    learner autocasting to bfloat16; the gap grows by orders of magnitude (it cannot meet 1e-3: the two
    round differently) but stays a rounding difference, not a different policy."""
    cfg = read_config(SMOKE, [f"models.policy.path={tiny_model_dir}", "models.policy.compute_dtype=bfloat16"])
    engine = assembly.build_engine(cfg, "policy", tiny_model_dir, seed=0)
    assert engine.dtype == torch.bfloat16
    gaps = {}
    for compute in (torch.float32, torch.bfloat16):
        if compute == torch.float32:
            model, tokenizer = load_model(tiny_model_dir)
            engine = EmbeddedEngine("m", model, tokenizer)
        learner, _ = load_model(tiny_model_dir)
        trainer = PolicyTrainer("m", learner, OptimConfig(), AlgorithmConfig(micro_batch_size=3), compute_dtype=compute)
        assert next(trainer.model.parameters()).dtype == torch.float32  # master weights stay float32
        gaps[compute] = _gap(trainer, _samples(engine))
    assert gaps[torch.float32] < 1e-4, gaps
    assert 10 * gaps[torch.float32] < gaps[torch.bfloat16] < 0.5, gaps


def test_a_bfloat16_push_sends_half_the_bytes_and_the_engine_gets_what_it_holds(tiny_model_dir: Path) -> None:
    """A real sender and receiver (gloo pair): float32 master weights pushed to a bfloat16 engine travel as
    bfloat16, half the bytes of a float32 push, and land bit for bit as the cast of the learner's."""
    learner, _ = load_model(tiny_model_dir)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    named = [(n, p.detach()) for n, p in learner.named_parameters()]
    model, tokenizer = load_model(tiny_model_dir, dtype="bfloat16")
    engine = EmbeddedEngine("m", model, tokenizer)
    reports = {}
    for dtype in (None, torch.bfloat16):
        config = WeightSyncConfig(timeout_s=20.0, join_retry_s=0.1)
        with WeightSender("127.0.0.1", config=config, dtype=dtype) as sender, \
                WeightReceiver(sender.endpoint, "r0", engine.load_weights, background=True, config=config) as rec:
            deadline = time.monotonic() + 30
            while not rec.connected and time.monotonic() < deadline:
                time.sleep(0.05)
            reports[dtype] = sender.push(named, version=1 if dtype is None else 2)
            assert reports[dtype].receivers_ok == ["r0"], reports[dtype]
            assert rec.wait_for_version(reports[dtype].version, timeout=20)
    assert reports[torch.bfloat16].bytes * 2 == reports[None].bytes
    for (name, mine), (_, theirs) in zip(engine.state_dict_tensors(), learner.named_parameters()):
        assert mine.dtype == torch.bfloat16 and torch.equal(mine, theirs.detach().to(torch.bfloat16)), name


@pytest.mark.e2e
def test_colocated_run_in_bfloat16_compute(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The whole colocated loop with compute_dtype=bfloat16: the learner autocasts, the engine serves
    bfloat16, the pushes cast; the on-policy gap is logged and finite."""
    from drmas.colocated import ColocatedRun
    from drmas.runtime.metrics import read_metrics

    cfg = read_config(SMOKE, [f"models.policy.path={tiny_model_dir}", "models.policy.compute_dtype=bfloat16",
                              f"trainer.output_dir={tmp_path / 'run'}", "trainer.steps=2", "eval.n_problems=0"])
    run = ColocatedRun(cfg, log=lambda *_: None)
    assert run.engines["policy"].dtype == torch.bfloat16
    assert run.trainers["policy"].compute_dtype == torch.bfloat16
    run.run()
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss/policy" in r]
    assert len(steps) == 2 and all(np.isfinite(r["loss/policy"]) for r in steps)


@pytest.mark.parametrize("override, message", [
    ("models.policy.compute_dtype=float16", r"models.policy.compute_dtype: 'float16' is not one of float32, bfloat16"),
    ("models.policy.dtype=bfloat16", None),
])
def test_compute_dtype_is_validated_naming_the_key(override: str, message: str | None) -> None:
    if message is None:  # bfloat16 weights, compute float32: autocast cannot widen
        with pytest.raises(ConfigError, match=r"models.policy.compute_dtype: float32 with dtype bfloat16"):
            read_config(SMOKE, [override, "models.policy.compute_dtype=float32"])
        assert read_config(SMOKE, [override]).models["policy"].compute_dtype is None
        return
    with pytest.raises(ConfigError, match=message):
        read_config(SMOKE, [override])


def test_sampling_flags_from_the_host_give_the_same_tokens() -> None:
    """`sample_tokens` with the host's greedy/nucleus flags equals the one that asks the tensors."""
    from drmas.engines.sampling import sample_tokens

    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    temperature = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.0, 1.3])
    top_p = torch.tensor([1.0, 0.9, 1.0, 0.5, 1.0, 0.8])
    uniforms = torch.rand(6, dtype=torch.float64)
    asked = sample_tokens(logits, temperature, top_p, uniforms)
    told = sample_tokens(logits, temperature, top_p, uniforms, greedy=(temperature <= 0).tolist(),
                         nucleus=(top_p < 1).tolist())
    assert all(torch.equal(a, b) for a, b in zip(asked, told))
