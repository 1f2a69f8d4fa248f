"""The GPU tier (`pytest -m gpu`): the paths that only a CUDA device exercises, on tiny models, in seconds.

Every test here is marked `gpu` and skipped with a reason where CUDA is absent, so the CPU suite stays
green and `pytest -q` runs everything else. On a GPU machine (one GPU is enough; the learner-ranks test
wants two) they run the real command line and the real components with every model on `cuda`:

- the colocated and the async smoke configs end to end (the first decode step of the embedded engine is
  where the first CUDA run crashed, issue 24);
- the precision contract: the engine's log-probs against the learner's on the same weights, <= 1e-3 per
  token in float32 on both sides;
- a weight push from CUDA parameters into an engine on the GPU (gloo: one GPU cannot hold both ends of an
  NCCL pair), in float32 and in the engine's bfloat16 (half the bytes);
- learner ranks (FSDP2 over NCCL) where more than one GPU is visible;
- a bfloat16 checkpoint round trip.
`scripts/gpu_check.sh` runs this tier after printing the GPU figures (`bench/gpu_figures.py`).

`DRMAS_GPU_TIER_DEVICE=cpu pytest -m gpu tests/test_gpu.py` runs the same tests on the CPU (a dry run of
the tier's own code on a machine without a GPU; the precision bound is then the CPU's).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from cli_run import run_cli
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
DEVICE = os.environ.get("DRMAS_GPU_TIER_DEVICE", "cuda")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                 reason="needs a CUDA device (the GPU tier: pytest -m gpu)")]
PORTS = ["pipeline.learner_base_port=0", "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0",
         "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0"]
GAP = 1e-3  # the precision contract on CUDA, float32 on both sides (max |learner - engine| per token)


def _run(config: str, out: Path, *overrides: str) -> None:
    command = [sys.executable, "-m", "drmas.cli", "run", "--config", str(ROOT / "configs" / config),
               f"trainer.output_dir={out}", "logging.tensorboard=false", *overrides]
    done = run_cli(command, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _engine_and_trainer(model_dir: Path, compute: torch.dtype):
    from drmas.config.schema import AlgorithmConfig, OptimConfig
    from drmas.engines.embedded import EmbeddedEngine
    from drmas.learner.policy import PolicyTrainer
    from drmas.models.loading import load_model

    device = torch.device(DEVICE)
    model, tokenizer = load_model(model_dir, dtype=str(compute).removeprefix("torch."), device=device)
    learner, _ = load_model(model_dir, device=device)
    trainer = PolicyTrainer("m", learner, OptimConfig(), AlgorithmConfig(micro_batch_size=8), compute_dtype=compute)
    return EmbeddedEngine("m", model, tokenizer, max_batch_size=8, seed=0), trainer


def _samples(engine, n: int = 12):
    from drmas.engines.base import SamplingParams
    from drmas.core.sample import Sample

    prompts = [engine.tokenizer(f"question {i}: " + "how many apples are left? " * (1 + i % 3))["input_ids"]
               for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(max_new_tokens=8 + 3 * i, seed=i) for i in range(n)])
    return [Sample(episode_id=f"e{i}", group_id="r-x-g0", agent="solver", model="m", turn=0, prompt_ids=p,
                   response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0, temperature=1.0,
                   valid=True) for i, (p, g) in enumerate(zip(prompts, gens))]


def _gap(trainer, samples) -> float:
    learner = trainer.logprobs(samples)
    return max(float((lp.cpu() - torch.as_tensor(s.behaviour_logprobs)).abs().max()) for lp, s in zip(learner, samples))


def test_colocated_smoke_with_its_model_on_cuda(tmp_path):
    out = tmp_path / "run"
    _run("smoke.yaml", out, f"models.policy.device={DEVICE}")
    steps = [r for r in read_metrics(out / "metrics.jsonl") if "loss/policy" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    assert all(abs(r["mismatch_kl/policy"]) < 1e-5 for r in steps), [r["mismatch_kl/policy"] for r in steps]
    assert all(r["grad_norm/policy"] > 0 for r in steps)


def test_async_smoke_with_every_model_on_cuda(tmp_path):
    out = tmp_path / "run"
    _run("smoke_async.yaml", out, f"models.solver_model.device={DEVICE}", f"models.verifier_model.device={DEVICE}",
         "pipeline.weights.backend=gloo", *PORTS)
    for model in ("solver_model", "verifier_model"):
        steps = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in steps] == [1, 2, 3]
        diffs = [v for r in steps for k, v in r.items() if k.startswith(f"logp_diff/{model}/")]
        assert diffs and max(diffs) <= GAP, diffs


def test_engine_log_probs_are_the_learners_on_the_same_weights(tiny_model_dir):
    """float32 on both sides (the default contract): within 1e-3 per token. bfloat16 on both sides: reported
    (it cannot meet 1e-3, see drmas.models.devices), and still a rounding difference."""
    gaps = {}
    for compute in (torch.float32, torch.bfloat16):
        engine, trainer = _engine_and_trainer(tiny_model_dir, compute)
        assert next(engine.model.parameters()).device.type == DEVICE
        gaps[compute] = _gap(trainer, _samples(engine))
    print(f"on-policy gap on CUDA: float32 {gaps[torch.float32]:.2e}, bfloat16 {gaps[torch.bfloat16]:.2e}")
    assert gaps[torch.float32] <= GAP, gaps
    assert gaps[torch.bfloat16] < 0.5, gaps


@pytest.mark.parametrize("compute", [torch.float32, torch.bfloat16])
def test_a_push_from_cuda_parameters_into_an_engine_on_the_gpu(tiny_model_dir, compute):
    from drmas.config.weights import WeightSyncConfig
    from drmas.weights import WeightReceiver, WeightSender

    engine, trainer = _engine_and_trainer(tiny_model_dir, compute)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    config = WeightSyncConfig(timeout_s=30.0, backend="gloo", join_retry_s=0.1)
    with WeightSender("127.0.0.1", config=config, device=torch.device(DEVICE), dtype=compute) as sender, \
            WeightReceiver(sender.endpoint, "r0", engine.load_weights, background=True, config=config) as rec:
        deadline = time.monotonic() + 30
        while not rec.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        report = sender.push(trainer.named_tensors(), version=1)
        assert report.receivers_ok == ["r0"], report
        assert rec.wait_for_version(1, timeout=30)
    floats = sum(p.numel() for p in trainer.model.parameters())
    assert report.bytes == floats * (2 if compute == torch.bfloat16 else 4)
    for (name, mine), (_, theirs) in zip(engine.state_dict_tensors(), trainer.model.named_parameters()):
        assert torch.equal(mine, theirs.detach().to(compute)), name
    assert _gap(trainer, _samples(engine, 4)) <= (GAP if compute == torch.float32 else 0.5)


@pytest.mark.skipif(DEVICE == "cuda" and torch.cuda.device_count() < 2, reason="learner ranks need two visible GPUs")
def test_learner_ranks_on_two_gpus(tmp_path):
    out = tmp_path / "run"
    _run("smoke_async.yaml", out, f"models.solver_model.device={DEVICE}", "models.solver_model.ranks=2",
         f"models.verifier_model.device={DEVICE}", "pipeline.weights.backend=gloo", "pipeline.num_rollouts=1", *PORTS)
    steps = read_metrics(out / "learner-solver_model" / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2, 3]
    diffs = [v for r in steps for k, v in r.items() if k.startswith("logp_diff/solver_model/")]
    assert diffs and max(diffs) <= GAP, diffs


def test_a_bfloat16_checkpoint_round_trip(tiny_model_dir, tmp_path):
    """bfloat16 weights and AdamW state on the GPU are saved and restored bit for bit (trainer state), and
    the HF directory of the checkpoint loads back as the same bfloat16 weights."""
    from drmas.models import checkpoint
    from drmas.config.schema import AlgorithmConfig, OptimConfig
    from drmas.learner.policy import PolicyTrainer
    from drmas.models.loading import load_model

    device = torch.device(DEVICE)
    model, tokenizer = load_model(tiny_model_dir, dtype="bfloat16", device=device)
    trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-2), AlgorithmConfig(micro_batch_size=4))
    engine, _ = _engine_and_trainer(tiny_model_dir, torch.bfloat16)
    samples = _samples(engine, 4)
    trainer.update(samples, np.array([1.0, -1.0, 0.5, -0.5]))
    ckpt = checkpoint.save_checkpoint(tmp_path, 1, {"m": (trainer.model, tokenizer)}, {"m": trainer.state_dict()}, {})
    fresh, _ = load_model(tiny_model_dir, dtype="bfloat16", device=device)
    restored = PolicyTrainer("m", fresh, OptimConfig(lr=1e-2), AlgorithmConfig(micro_batch_size=4))
    restored.update(samples, np.zeros(4))  # AdamW state exists before it is loaded over
    checkpoint.load_trainer(ckpt, "m", restored)
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), restored.model.named_parameters()):
        assert b.dtype == torch.bfloat16 and torch.equal(a, b), name
    mine, theirs = trainer.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert all(torch.equal(mine[k]["exp_avg"], theirs[k]["exp_avg"]) for k in mine)
    saved, _ = load_model(ckpt / "m", dtype="bfloat16")
    for (name, a), (_, b) in zip(trainer.model.named_parameters(), saved.named_parameters()):
        assert torch.equal(a.cpu(), b), name
