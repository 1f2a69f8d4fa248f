"""The learner's memory savings change no result: its loss and gradient norm on a fixed batch equal a plain
full-logits computation from the same weights (one sample at a time, no padding, every position through the
LM head, one log-softmax over the whole tensor, no checkpointing, one backward over the whole batch).

What the learner does differently, all of which these tests go through: activation checkpointing of the
decoder layers, log-softmax in chunks of positions (made small here so that a batch spans many), only
response positions through the head, padded micro-batches with accumulated gradients.
"""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import drmas.engines.logprobs as logprobs_module
from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.engines.base import SamplingParams
from drmas.engines.embedded import EmbeddedEngine
from drmas.algorithms.ppo import ppo_loss
from drmas.learner.policy import PolicyTrainer
from drmas.models import adapters
from drmas.models.loading import load_model
from drmas.core.sample import Sample

TEMPERATURES = (1.0, 0.7, 1.3)


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    """Real samples of the tiny model at three temperatures, prompts and responses of several lengths, with
    behaviour log-probs moved off the learner's so the importance weights are not all 1."""
    model, tokenizer = load_model(tiny_model_dir)
    engine = EmbeddedEngine("m", model, tokenizer, seed=0)
    rng = np.random.default_rng(0)
    prompts = [tokenizer("question " * (1 + 3 * i) + f"{i}: how many apples?")["input_ids"] for i in range(6)]
    samples = []
    for i, prompt in enumerate(prompts):
        t = TEMPERATURES[i % 3]
        (gen,) = engine.generate([prompt], [SamplingParams(temperature=t, max_new_tokens=4 + 3 * i)])
        behaviour = np.asarray(gen.logprobs, dtype=np.float32) + rng.normal(0, 0.05, len(gen.logprobs)).astype(np.float32)
        samples.append(Sample(episode_id=f"e{i}", group_id="g", agent="solver", model="m", turn=0, prompt_ids=prompt,
                              response_ids=gen.token_ids, behaviour_logprobs=behaviour, policy_version=0,
                              temperature=t, valid=True, reward=float(i % 2)))
    assert len({len(s.response_ids) for s in samples}) > 2
    return samples, np.linspace(-1.0, 1.5, len(samples))


def reference(model_dir, samples, adv, alg: AlgorithmConfig) -> tuple[float, float]:
    """Loss and gradient norm of the first optimizer step, computed the plain way (see the module docstring)."""
    model, _ = load_model(model_dir)
    model.train()
    rows = []
    for s in samples:
        ids = torch.tensor(np.concatenate([s.prompt_ids, s.response_ids]), dtype=torch.long)[None]
        logits = model(input_ids=ids, use_cache=False).logits[0].float()  # every position
        logp = torch.log_softmax(logits / (s.temperature if s.temperature > 0 else 1.0), dim=-1)
        start = len(s.prompt_ids) - 1  # position p predicts token p + 1
        targets = torch.as_tensor(s.response_ids, dtype=torch.long)
        rows.append(logp[start : start + len(targets)].gather(-1, targets[:, None]).squeeze(-1))
    logps = pad_sequence(rows, batch_first=True)
    behaviour = pad_sequence([torch.as_tensor(s.behaviour_logprobs) for s in samples], batch_first=True)
    mask = pad_sequence([torch.ones(len(s.response_ids)) for s in samples], batch_first=True)
    loss, _ = ppo_loss(logps, logps.detach(), behaviour, torch.as_tensor(adv, dtype=torch.float32), mask,
                       clip_low=alg.clip_low, clip_high=alg.clip_high, dual_clip=alg.dual_clip,
                       max_is_weight=alg.max_is_weight, aggregation=alg.aggregation)
    loss.backward()
    # the norm as torch computes it (float32 sums, as the learner's clipping does): the quantity compared is the
    # gradient, not two ways of summing its squares, which differ by ~1e-4 relative on the embedding alone
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    return float(loss.detach()), float(norm)


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_loss_and_grad_norm_equal_the_full_logits_reference(tiny_model_dir, batch, monkeypatch, aggregation):
    samples, adv = batch
    vocab = load_model(tiny_model_dir)[0].config.vocab_size
    monkeypatch.setattr(logprobs_module, "LOGSOFTMAX_CHUNK_BYTES", 4 * vocab * 5)  # 5 positions a chunk
    alg = AlgorithmConfig(micro_batch_size=2, aggregation=aggregation)
    want_loss, want_norm = reference(tiny_model_dir, samples, adv, alg)
    model, _ = load_model(tiny_model_dir)
    trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-3, grad_clip=1.0), alg, activation_checkpointing=True)
    assert trainer.model.is_gradient_checkpointing
    metrics = trainer.update(samples, adv)
    assert metrics["loss/m"] == pytest.approx(want_loss, rel=1e-5, abs=1e-7)
    assert metrics["grad_norm/m"] == pytest.approx(want_norm, rel=1e-5)
    assert want_norm > 0.1 and abs(want_loss) > 1e-3  # a batch that moves the weights


def _layer_runs(trainer: PolicyTrainer, ids: torch.Tensor) -> int:
    """Decoder-layer forward runs of one training forward and backward."""
    runs = []
    base = trainer.model.get_base_model() if trainer.adapter is not None else trainer.model

    def counted(forward):
        def run(*args, **kwargs):
            runs.append(1)
            return forward(*args, **kwargs)
        return run

    for layer in base.model.layers:  # (a recomputation runs forward but not the forward hooks)
        layer.mlp.forward = counted(layer.mlp.forward)
    with trainer._autocast():
        trainer.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits.sum().backward()
    return len(runs)


def test_checkpointed_layers_are_recomputed_in_the_backward(tiny_model_dir):
    """models.<id>.activation_checkpointing does what it says: every decoder layer runs again in the backward
    (its intermediate tensors were not kept), and no layer runs again without it. What that saves is
    measured by bench/memory.py."""
    ids = torch.randint(0, 1000, (2, 16))
    layers = load_model(tiny_model_dir)[0].config.num_hidden_layers
    on = PolicyTrainer("m", load_model(tiny_model_dir)[0], OptimConfig(), AlgorithmConfig(),
                       activation_checkpointing=True)
    off = PolicyTrainer("m", load_model(tiny_model_dir)[0], OptimConfig(), AlgorithmConfig(),
                        activation_checkpointing=False)
    assert (_layer_runs(on, ids), _layer_runs(off, ids)) == (2 * layers, layers)


def _adapter_trainer(model_dir, checkpointing: bool) -> PolicyTrainer:
    spec = adapters.AdapterSpec("solver", rank=4, alpha=8.0, dropout=0.0, target_modules=("q_proj", "v_proj", "up_proj"))
    model = adapters.attach_adapters(load_model(model_dir)[0], [spec], trainable=True, seed=0)
    return PolicyTrainer("m", model, OptimConfig(lr=1e-2, grad_clip=1.0), AlgorithmConfig(micro_batch_size=2),
                         adapter="solver", activation_checkpointing=checkpointing)


def test_an_adapters_learner_recomputes_the_frozen_base_and_trains_the_same(tiny_model_dir, batch):
    """With adapters the frozen base's layers are checkpointed too (models.<id>.activation_checkpointing): every
    layer runs again in the backward, and two updates give the loss, gradient norm and adapter weights of a plain
    update (peft's LoRA layers sit inside the recomputed decoder layers; the base gets no gradient either way)."""
    samples, adv = batch
    ids = torch.randint(0, 1000, (2, 16))
    layers = load_model(tiny_model_dir)[0].config.num_hidden_layers
    assert _layer_runs(_adapter_trainer(tiny_model_dir, True), ids) == 2 * layers
    assert _layer_runs(_adapter_trainer(tiny_model_dir, False), ids) == layers
    results = {}
    for on in (True, False):
        trainer = _adapter_trainer(tiny_model_dir, on)
        metrics = [trainer.update(samples, adv) for _ in range(2)]
        weights = adapters.adapter_parameters(trainer.model, "solver")
        assert all(p.grad is None for n, p in trainer.model.named_parameters() if "lora_" not in n)  # base frozen
        results[on] = metrics, {k: v.detach().clone() for k, v in weights.items()}
    (m_on, w_on), (m_off, w_off) = results[True], results[False]
    for a, b in zip(m_on, m_off):
        assert a["loss/m"] == pytest.approx(b["loss/m"], rel=1e-5, abs=1e-7)
        assert a["grad_norm/m"] == pytest.approx(b["grad_norm/m"], rel=1e-5)
    assert m_off[1]["grad_norm/m"] > 0
    assert w_on.keys() == w_off.keys() and len(w_on) == 3 * 2 * layers  # A and B of 3 modules per layer
    for name in w_on:  # checkpointed, the head's log-softmax is fused per chunk (drmas.engines.fused_head): its
        # float rounding differs from the plain one's (1e-7 relative), which Adam's normalisation lifts where a
        # gradient is near 0 (seen: one element of 256 off by 4e-6 after two steps of 1e-2)
        torch.testing.assert_close(w_on[name], w_off[name], rtol=1e-4, atol=1e-5)


HEAP_PROBE = """
import sys, torch
from drmas.learner.heap import map_large_blocks
taken = map_large_blocks(int(sys.argv[1]))
def rss():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) * 1024
big = torch.ones(16 << 18); del big  # freeing a 16 MB mapping raises glibc's threshold past 2 MB
before = rss()
blocks, pins = [], []
for _ in range(50):  # 100 MB of 2 MB tensors, as a training pass makes them, each followed by a small one that
    blocks.append(torch.ones(2 << 18))  # outlives it (the heap can only shrink from its top: with one pin at
    pins.append(torch.ones(1000))  # the end, glibc sometimes placed it in a lower hole and trimmed the rest)
del blocks
print(taken, (rss() - before) / 1e6)
"""


def _kept_after_free(threshold_kb: int) -> tuple[bool, float]:
    """(setting taken, MB still resident after 100 MB of 2 MB tensors were freed) in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run([sys.executable, "-c", HEAP_PROBE, str(threshold_kb)], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return out[0] == "True", float(out[1])


def test_mapped_large_blocks_return_freed_tensor_memory_to_the_system():
    """models.<id>.heap_mmap_threshold_kb: with glibc's default the freed tensors stay resident; with the
    learner's setting (1 MiB) they are given back at once."""
    assert _kept_after_free(0) == (False, pytest.approx(100, abs=15))
    assert _kept_after_free(1024) == (True, pytest.approx(0, abs=15))


THP_PROBE = """
import sys, torch
from drmas.learner.heap import advise_huge_pages, huge_pages_in_effect
if sys.argv[1] == "late":  # a tensor before the advice: the allocator has read its setting already
    torch.ones(1)
advise_huge_pages(sys.argv[1] != "off")
def huge_kb():
    return int(open("/proc/self/smaps_rollup").read().split("AnonHugePages:")[1].split()[0])
before = huge_kb()
block = torch.ones(16 << 20)  # 64 MB, every page written
print(huge_pages_in_effect(), (huge_kb() - before) / 1024)
"""


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "never"
    return text.split("[")[1].split("]")[0]


@pytest.mark.parametrize("when", ["early", "late", "off"])
def test_huge_pages_are_taken_only_when_advised_before_the_first_tensor(when):
    """models.<id>.huge_pages: advised before any tensor (as drmas-learner does at its start), a 64 MB tensor is
    page-aligned and, where the kernel's THP mode allows, backed by huge pages; advised after a tensor, or not
    at all, PyTorch's allocator keeps its 64-byte alignment (and huge_pages_in_effect says so)."""
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    out = subprocess.run([sys.executable, "-c", THP_PROBE, when], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    in_effect, huge_mb = out[0] == "True", float(out[1])
    assert in_effect == (when == "early")
    if when == "early" and _thp_mode() == "madvise":
        assert huge_mb >= 32  # most of the 64 MB in 2 MB pages
    if _thp_mode() != "always":
        assert (huge_mb < 8) == (when != "early")
