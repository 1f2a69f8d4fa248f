"""The LM head and the log-softmax fused, a chunk of positions at a time: the learner's log-probs with gradients
without ever holding the logits of a whole micro-batch, nor their gradient.

Why (issue 37, bench/memory.py): with activation checkpointing the learner's peak came at the head. The head's
logits of a micro-batch (rows x response positions x vocabulary: 127 MB for 8 x 81 positions of SmolLM2's 49k
vocabulary) stayed alive for the chunked log-softmax's backward, their gradient was assembled at the same size, and
the head's weight gradient (113 MB) sat beside the weight's own gradient until the backward reached the tied input
embedding: about 0.35 GB above the weights, gradients and AdamW moments, on top of every layer's checkpointed input.

Here each chunk's logits are made, reduced to the target's log-prob and its log-sum-exp, and freed; the backward
makes them again (one more head matmul per chunk, about 1% of an update for SmolLM2), turns them into the gradient
of the log-probs in place, and adds the weight's share straight into `weight.grad` (addmm into the gradient, no
separate buffer). The values are the contract's (`drmas.engines.logprobs`): log softmax(logits / T)[target] in
float32, by torch's log_softmax as the engines compute it (the same logits give the same log-probs).

It applies only where that is all a model's head does: a bias-free `nn.Linear` on the decoder's last hidden state,
in a model type known to add nothing between them (no logit scaling or soft-capping), float32 weights in plain
tensors (not sharded, no autocast). Everything else takes the general path, the model's own forward.
"""

from __future__ import annotations

import torch

# model types whose causal-LM forward is decoder -> last hidden states -> bias-free linear head, nothing else
PLAIN_HEAD_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(decoder, head weight) where `model`'s log-probs can be computed by `head_logprobs`; None otherwise."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_MODEL_TYPES:
        return None
    try:
        decoder, head = model.get_decoder(), model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    weight = head.weight
    if type(weight) is not torch.nn.Parameter or weight.dtype != torch.float32:
        return None  # a DTensor (sharded) or a low-precision copy: the general path
    if torch.is_autocast_enabled(weight.device.type):
        return None
    return decoder, weight


class _HeadLogprobs(torch.autograd.Function):
    """log softmax(hidden @ weight.T / temps)[targets] of `n` positions, `step` at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temps, step):  # noqa: D102 - autograd's interface
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for start in range(0, hidden.shape[0], step):
            end = start + step
            logits = _logits(hidden[start:end], weight, None if temps is None else temps[start:end])
            picked = targets[start:end, None]
            # torch's log_softmax, as the engines take it: another fp32 reduction (logsumexp's) differs by up to
            # 1e-4 over a 49k vocabulary, which the on-policy check between engine and learner would see
            out[start:end] = torch.log_softmax(logits, dim=-1).gather(-1, picked).squeeze(-1)
            lse[start:end] = logits.gather(-1, picked).squeeze(-1) - out[start:end]  # for the backward's softmax
            del logits
        ctx.save_for_backward(hidden, weight, targets, temps, lse)
        ctx.step = step
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: D102 - autograd's interface
        hidden, weight, targets, temps, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        weight_grad = weight.requires_grad
        if weight_grad and weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        for start in range(0, hidden.shape[0], ctx.step):
            end = start + ctx.step
            h, t = hidden[start:end], None if temps is None else temps[start:end]
            # d logp[target] / d logits = (onehot(target) - softmax) / T, times the incoming gradient
            grad = _logits(h, weight, t).sub_(lse[start:end, None]).exp_().neg_()
            rows = torch.arange(grad.shape[0], device=grad.device)
            grad[rows, targets[start:end]] += 1.0
            grad.mul_(grad_out[start:end, None] if t is None else (grad_out[start:end] / t.squeeze(-1))[:, None])
            if grad_hidden is not None:
                torch.matmul(grad, weight, out=grad_hidden[start:end])
            if weight_grad:
                weight.grad.addmm_(grad.T, h)
            del grad
        # the weight's gradient went into weight.grad: no gradient flows to it through autograd
        return grad_hidden, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temps: torch.Tensor | None) -> torch.Tensor:
    logits = hidden.float() @ weight.T
    return logits if temps is None else logits.div_(temps)


def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor | None,
                  step: int) -> torch.Tensor:
    """Log-probs of `targets` (n) under the head `weight` (vocab x hidden) applied to `hidden` (n x hidden), at
    per-position temperatures `temps` (n x 1, or None for 1), `step` positions at a time; the weight's gradient
    is added into `weight.grad` during the backward (see the module docstring)."""
    return _HeadLogprobs.apply(hidden, weight, targets, temps, step)
