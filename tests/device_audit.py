"""The device audit's checks, run in a process of their own (`tests/test_device_audit.py` starts it).

Each check puts a model on the simulated device of `tests/simulated_device.py` and drives one part of
drmas through it: the embedded engine (batch joins and compaction, stop strings, seeds, greedy and nucleus
rows), the weight path into it, the learner's update, priming and model building, evaluation. Any tensor
made on the CPU that meets the model's tensors raises there, as it would on CUDA. The results go to stdout
as one JSON object, check name -> "ok" or the traceback.

    python tests/device_audit.py MODEL_DIR [CHECK ...]
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulated_device import DeviceMix, register, simulated  # noqa: E402

from drmas.config.schema import AlgorithmConfig, OptimConfig, TinyModelConfig  # noqa: E402
from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.embedded import EmbeddedEngine  # noqa: E402
from drmas.models.loading import load_model  # noqa: E402
from drmas.core.sample import Sample  # noqa: E402

DEVICE = register()
CHECKS = {}


def check(function):
    CHECKS[function.__name__] = function
    return function


def _expect_mix(action, what: str) -> None:
    try:
        action()
    except DeviceMix:
        return
    raise AssertionError(f"the simulated device let {what} through")


def _requests(tokenizer, n: int = 10) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of varied lengths and every kind of row: seeded and not, greedy, nucleus, stop strings, and
    lengths that end rows at different steps (compaction, joins)."""
    prompts = [tokenizer(f"question {i}: " + "how many apples are left " * (i % 4))["input_ids"] for i in range(n)]
    params = [SamplingParams(temperature=(0.0 if i % 5 == 0 else 1.0), top_p=(0.9 if i % 3 == 0 else 1.0),
                             max_new_tokens=3 + (i * 7) % 11, seed=(i if i % 2 else None),
                             stop=((" the", "e") if i % 4 == 1 else ())) for i in range(n)]
    return prompts, params


@check
def mechanism_catches_device_mixing(model_dir: Path) -> None:
    """The audit can fail: what CUDA refuses is refused here, what CUDA accepts is accepted."""
    with simulated() as mode:
        on_device = torch.arange(6, device=DEVICE)
        host = torch.arange(6)
        _expect_mix(lambda: host[on_device.nonzero().flatten()], "CPU tensor indexed by device indices")
        _expect_mix(lambda: on_device + host, "device + CPU tensor")
        _expect_mix(lambda: torch.nn.functional.embedding(host, torch.ones(8, 2, device=DEVICE)),
                    "an embedding of CPU ids on device weights")
        _expect_mix(lambda: torch.rand(3, generator=torch.Generator(), device=DEVICE), "a CPU generator")
        assert (on_device[host[:2]] + torch.tensor(1)).tolist() == [1, 2]  # CPU indices, CPU scalar: allowed
        assert on_device.sum().item() == 15 and mode.host_reads == 2
        try:
            on_device.numpy()
        except TypeError:
            pass
        else:
            raise AssertionError("numpy() of a device tensor passed")


@check
def engine_on_device_matches_cpu(model_dir: Path) -> None:
    """The embedded engine on the device: no tensor of the CPU meets the model's; the same tokens as on
    the CPU (the simulation computes with the CPU kernels); a batch of 4 with 10 requests makes rows join
    a running batch and be dropped from it."""
    model, tokenizer = load_model(model_dir)
    prompts, params = _requests(tokenizer)
    expected = EmbeddedEngine("m", model, tokenizer, max_batch_size=4, seed=3).generate(prompts, params)
    with simulated():
        engine = EmbeddedEngine("m", model.to(DEVICE), tokenizer, max_batch_size=4, seed=3)
        got = engine.generate(prompts, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in expected]
    assert np.allclose([lp for g in got for lp in g.logprobs], [lp for g in expected for lp in g.logprobs], atol=1e-5)


@check
def engine_decode_step_reads_the_device_once(model_dir: Path) -> None:
    """Each decode step of a running batch moves data to the host once (the sampled tokens and their
    log-probs); greedy/nucleus/finished are known on the host. On a GPU every extra read is a sync."""
    model, tokenizer = load_model(model_dir)
    prompts = [tokenizer("count the apples please")["input_ids"]] * 4
    with simulated() as mode:
        engine = EmbeddedEngine("m", model.to(DEVICE), tokenizer, max_batch_size=4, eos_token_ids=())
        engine.generate(prompts, [SamplingParams(max_new_tokens=2)] * 4)
        reads = mode.host_reads
        engine.generate(prompts, [SamplingParams(max_new_tokens=22, top_p=0.9)] * 2
                        + [SamplingParams(max_new_tokens=22, temperature=0.0)] * 2)
        per_step = (mode.host_reads - reads) / 22
    assert per_step <= 1.1, f"{per_step:.2f} device-to-host reads per decode step"


@check
def weights_from_a_device_learner_into_a_device_engine(model_dir: Path) -> None:
    """The weight path: a learner's tensors on the device are packed into CPU units (gloo carries CPU
    bytes), unpacked into the CPU receive pool and loaded into an engine on the device."""
    from drmas.weights.chunks import BufferPool, Packer, Unpacker, plan_layout

    learner, _ = load_model(model_dir)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model, tokenizer = load_model(model_dir)
    with simulated():
        learner.to(DEVICE)
        engine = EmbeddedEngine("m", model.to(DEVICE), tokenizer)
        named = [(n, p.detach()) for n, p in learner.named_parameters()]
        layout = plan_layout(named, chunk_bytes=1 << 16)
        packer = Packer(layout, [None if s.alias_of >= 0 else t for s, (_, t) in zip(layout.tensors, named)])
        unpacker = Unpacker(layout, BufferPool(layout.chunk_bytes, torch.device("cpu")))
        scratch = torch.empty(layout.chunk_bytes, dtype=torch.uint8)

        def received():
            for index in range(len(layout.units)):
                unpacker.target(index).copy_(packer.unit_bytes(index, scratch))
                yield from unpacker.complete(index)

        engine.load_weights(received(), version=1)
        for (name, mine), (_, theirs) in zip(engine.state_dict_tensors(), learner.named_parameters()):
            assert torch.equal(mine.cpu(), theirs.detach().cpu()), name


@check
def learner_update_on_device(model_dir: Path) -> None:
    """PolicyTrainer on the device: the proximal pass, the loss, backward, clipping, AdamW, the metrics."""
    from drmas.learner.policy import PolicyTrainer

    model, tokenizer = load_model(model_dir)
    prompts, params = _requests(tokenizer, 6)
    with simulated():
        engine = EmbeddedEngine("m", model.to(DEVICE), tokenizer)
        gens = engine.generate(prompts, params)
        samples = [Sample(episode_id=f"e{i}", group_id="r-x-g0", agent="solver", model="m", turn=0, prompt_ids=p,
                          response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0,
                          temperature=max(s.temperature, 0.0), valid=True, reward=float(i % 2))
                   for i, (p, g, s) in enumerate(zip(prompts, gens, params))]
        learner, _ = load_model(model_dir)
        # without activation checkpointing: torch's recomputation runs in autograd's device thread, where the
        # simulator's thread-local dispatch mode is not active (the process aborts); on CUDA it is torch's own path
        trainer = PolicyTrainer("m", learner.to(DEVICE), OptimConfig(lr=1e-2),
                                AlgorithmConfig(micro_batch_size=4, optim_steps_per_update=2),
                                activation_checkpointing=False)
        before = [p.detach().cpu().clone() for p in trainer.params]
        metrics = trainer.update(samples, np.array([1.0, -1.0] * 3), version=0)
        after = [p.detach().cpu() for p in trainer.params]
    assert all(np.isfinite(v) for v in metrics.values()), metrics
    assert metrics["logp_diff/m/r"] < 1e-4, metrics
    assert any(not torch.equal(b, a) for b, a in zip(before, after))


@check
def sequence_logprobs_on_device(model_dir: Path) -> None:
    """Log-probs of given responses come back on the model's device, also when every response is empty."""
    from drmas.engines.logprobs import sequence_logprobs

    model, tokenizer = load_model(model_dir)
    with simulated():
        model.to(DEVICE)
        for responses in ([[5, 6], [7]], [[], []]):
            out = sequence_logprobs(model, [[1, 2, 3], [4]], responses)
            assert all(t.device == DEVICE for t in out), [t.device for t in out]


@check
def priming_on_device(model_dir: Path) -> None:
    """Format priming trains the model where it lives."""
    from drmas.models.priming import prime_formats

    model, tokenizer = load_model(model_dir)
    with simulated() as mode:
        loss = prime_formats(model.to(DEVICE), tokenizer, steps=2, seed=0, batch_size=2)
    assert np.isfinite(loss) and mode.device_ops > 100


@check
def tiny_model_built_on_its_device(model_dir: Path) -> None:
    """Building a primed tiny model on a device primes it there (the H200 run primed a 270M model on
    the CPU for minutes), and writes a normal CPU-loadable directory."""
    import os
    import tempfile

    from drmas.core.cache import cache_dir
    from drmas.models.loading import build_tiny_model, smollm2_tokenizer_dir

    tokenizer = smollm2_tokenizer_dir()
    with tempfile.TemporaryDirectory() as tmp:  # a fresh cache (the tokenizer linked in): this build must run
        (Path(tmp) / "tokenizers").mkdir()
        (Path(tmp) / "tokenizers" / tokenizer.name).symlink_to(tokenizer)
        os.environ["DRMAS_CACHE"] = tmp
        assert cache_dir() == Path(tmp)
        with simulated() as mode:
            path = build_tiny_model(TinyModelConfig(prime_steps=2), device=DEVICE)
        assert mode.device_ops > 100, f"only {mode.device_ops} operations ran on the device"
        model, _ = load_model(path)
        assert next(model.parameters()).device.type == "cpu"


@check
def evaluation_on_device(model_dir: Path) -> None:
    """A held-out evaluation (episodes through the request level) with its engine on the device."""
    from drmas import assembly
    from drmas.config.load import read_config
    from drmas.evaluation import heldout_accuracy
    from drmas.episodes import EpisodeRunner

    cfg = read_config(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml", [f"models.policy.path={model_dir}"])
    task = assembly.build_task(cfg)
    model, tokenizer = load_model(model_dir)
    with simulated():
        engine = EmbeddedEngine("policy", model.to(DEVICE), tokenizer, max_batch_size=3)
        runner = EpisodeRunner(assembly.build_orchestra(cfg, task), {"policy": engine},
                               assembly.agent_specs(cfg, temperature=0.0), cfg.algorithm.invalid_penalty, seed=0)
        result = heldout_accuracy(runner, list(task.split("test"))[:4])
    assert result["n"] == 4.0


def main() -> None:
    model_dir = Path(sys.argv[1])
    names = sys.argv[2:] or list(CHECKS)
    results = {}
    for name in names:
        try:
            CHECKS[name](model_dir)
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - every failure is reported, the other checks still run
            results[name] = traceback.format_exc()
    print("AUDIT " + json.dumps(results))


if __name__ == "__main__":
    main()
