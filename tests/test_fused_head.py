"""drmas.engines.fused_head: the head and log-softmax fused per chunk give the log-probs and gradients of the plain
computation (logits = hidden @ weight.T, log-softmax over the vocabulary, the target's entry), with the weight's
gradient added into weight.grad, and which models take that path."""

from __future__ import annotations

import pytest
import torch

from drmas.engines.fused_head import head_logprobs, plain_head
from drmas.models.loading import load_model


def _plain(hidden, weight, targets, temps):
    logits = hidden @ weight.T
    if temps is not None:
        logits = logits / temps
    return torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperatures", [None, "mixed"])
@pytest.mark.parametrize("step", [1, 5, 64])
def test_values_and_gradients_equal_the_plain_head(temperatures, step):
    """Chunks of 1, 5 (uneven) and all of the 23 positions; the weight also feeds an embedding lookup, as a tied
    input embedding does, and holds a gradient from an earlier micro-batch, to which both parts are added."""
    gen = torch.Generator().manual_seed(0)
    hidden0 = torch.randn(23, 16, generator=gen)
    weight0 = torch.randn(50, 16, generator=gen) * 0.5
    targets = torch.randint(0, 50, (23,), generator=gen)
    tokens = torch.randint(0, 50, (7,), generator=gen)
    temps = None if temperatures is None else torch.tensor([0.7, 1.0, 1.3] * 7 + [0.9, 1.1])[:, None]
    coef = torch.randn(23, generator=gen)
    earlier = torch.randn(50, 16, generator=gen)
    results = []
    for fused in (True, False):
        hidden, weight = hidden0.clone().requires_grad_(), torch.nn.Parameter(weight0.clone())
        weight.grad = earlier.clone()
        logp = head_logprobs(hidden, weight, targets, temps, step) if fused else _plain(hidden, weight, targets, temps)
        embedded = torch.nn.functional.embedding(tokens, weight)  # the tied input embedding's use of the weight
        ((logp * coef).sum() + embedded.square().sum()).backward()
        results.append((logp.detach(), hidden.grad, weight.grad))
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_frozen_head_gets_no_gradient_and_the_hidden_states_do():
    hidden = torch.randn(4, 8, requires_grad=True)
    weight = torch.randn(10, 8)  # frozen (an adapter's base)
    head_logprobs(hidden, weight, torch.tensor([1, 2, 3, 4]), None, 3).sum().backward()
    assert weight.grad is None and hidden.grad is not None and hidden.grad.abs().sum() > 0


def test_plain_head_takes_llama_in_float32_only(tiny_model_dir):
    model, _ = load_model(tiny_model_dir)
    decoder, weight = plain_head(model)
    assert decoder is model.get_decoder() and weight is model.get_output_embeddings().weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert plain_head(model) is None  # autocast: the model's own forward
    assert plain_head(model.to(torch.bfloat16)) is None
    model.config.model_type = "gemma2"  # soft-caps its logits: not a plain head
    assert plain_head(model) is None



def test_the_log_probs_are_the_engines_reduction_over_a_real_vocabulary():
    """The contract of drmas.engines.logprobs: the learner's log-probs equal what torch's log_softmax gives the
    engines on the same logits. Over a 49k vocabulary with confident logits, another fp32 reduction
    (logits[t] - logsumexp) was 1e-4 off, which the on-policy check between a vLLM engine and its learner saw."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(40, 64, generator=gen)
    weight = torch.nn.Parameter(torch.randn(49152, 64, generator=gen) * 0.4)  # logits up to about +-12
    targets = torch.randint(0, 49152, (40,), generator=gen)
    temps = torch.tensor([1.0, 0.7, 1.3, 0.9] * 10)[:, None]
    for t in (None, temps):
        ours = head_logprobs(hidden, weight, targets, t, 16)
        theirs = _plain(hidden, weight, targets, t)
        assert torch.equal(ours.detach(), theirs.detach()) or (ours - theirs).abs().max() < 2e-6
