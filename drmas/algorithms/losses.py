"""Policy losses: the registry, what a loss sees, and the pieces the built-in losses share.

A loss turns one micro-batch's log-probs into a scalar to backpropagate. It is chosen by name
(`algorithm.loss`) from `POLICY_LOSSES`, filled by the built-ins (`ppo.py`, `gspo.py`, `cispo.py`) and plugins
alike, and called as ``loss(inputs, alg) -> LossOutput``. Every loss sees the same three log-probs per response
token: the current weights' (`logprobs`, the only ones with a gradient), the proximal policy's (the weights the
update started from: the centre of a trust region) and the behaviour policy's (the weights that sampled the
tokens, possibly some versions older), with the advantages and the mask of real tokens. `LossOutput.per` says
whether the loss is a mean over tokens or over sequences, so the trainer weighs micro-batches right.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Literal

import torch

from drmas.config.schema import AGGREGATIONS
from drmas.core.registry import Registry

if TYPE_CHECKING:
    from drmas.config.schema import AlgorithmConfig

# exp() of a larger log-ratio overflows float32; values beyond this are deep in the clipped region anyway.
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, [B, T] each (`advantages` may be [B]: one per sequence), padded where `mask` is 0."""

    logprobs: torch.Tensor
    proximal_logprobs: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class LossOutput:
    """The scalar loss, float stats for logging, and the unit it averages over: "token" (the trainer weighs the
    micro-batch by its share of the update's tokens) or "sequence" (by its share of the sequences)."""

    loss: torch.Tensor
    stats: dict[str, float]
    per: Literal["token", "sequence"]


PolicyLoss = Callable[[LossInputs, "AlgorithmConfig"], LossOutput]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def policy_loss(inputs: LossInputs, alg: AlgorithmConfig) -> LossOutput:
    """The loss `alg.loss` names, on `inputs`; its output is checked."""
    out = POLICY_LOSSES.lookup(alg.loss, "algorithm.loss")(inputs, alg)
    if not isinstance(out, LossOutput) or out.per not in ("token", "sequence") or out.loss.dim() != 0:
        raise TypeError(f"policy loss {alg.loss!r} must return a LossOutput with a scalar loss and per "
                        f"'token' or 'sequence', got {out!r:.200}")
    return out


@dataclass(frozen=True)
class Prepared:
    """A micro-batch ready for a loss: >= float32 tensors, advantages [B, T] (0 on padding, detached), the
    boolean mask and the clamped log-ratio current / proximal (0 on padding)."""

    logprobs: torch.Tensor
    proximal: torch.Tensor
    behaviour: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    log_ratio: torch.Tensor


def prepare(inputs: LossInputs, aggregation: str = "token-mean") -> Prepared:
    """Validated, promoted and masked inputs (ValueError naming a wrong shape or option)."""
    others = {"proximal_logprobs": inputs.proximal_logprobs, "behaviour_logprobs": inputs.behaviour_logprobs,
              "mask": inputs.mask}
    adv = _check_inputs(inputs.logprobs, others, inputs.advantages, aggregation)
    # Log-prob differences of ~1e-3 vanish in bf16/fp16, so ratios are always computed in >= float32.
    dtype = torch.promote_types(inputs.logprobs.dtype, torch.float32)
    logprobs, proximal, behaviour, adv = (
        t.to(dtype) for t in (inputs.logprobs, inputs.proximal_logprobs, inputs.behaviour_logprobs, adv)
    )
    m = inputs.mask.bool()
    zeros = torch.zeros_like(logprobs)
    adv = torch.where(m, adv, zeros)  # padding may hold garbage advantages; keep them out of the graph
    log_ratio = torch.where(m, logprobs - proximal.detach(), zeros).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return Prepared(logprobs, proximal, behaviour, adv, m, log_ratio)


def check_clips(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
    if not (0.0 <= clip_low < 1.0 and clip_high >= 0.0):
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `x` over positions where `mask` is set; 0 for an empty mask (never nan).

    `torch.where` rather than multiplication keeps nan/inf at padded positions from leaking in.
    """
    m = mask.bool()
    total = torch.where(m, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / m.sum().clamp(min=1)
    return total.sum(dim) / m.sum(dim).clamp(min=1)


def _check_inputs(
    logprobs: torch.Tensor, others: dict[str, torch.Tensor], advantages: torch.Tensor, aggregation: str
) -> torch.Tensor:
    """Validate shapes/options and return advantages broadcast to [B, T] (detached)."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; expected one of {AGGREGATIONS}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
    for name, t in others.items():
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(logprobs.shape)}")
    if advantages.dim() == 1 and advantages.shape[0] == logprobs.shape[0]:
        advantages = advantages.unsqueeze(-1).expand_as(logprobs)
    if advantages.shape != logprobs.shape:
        raise ValueError(f"advantages must be [B] or [B, T], got shape {tuple(advantages.shape)}")
    return advantages.detach().to(logprobs.dtype)


def clipped_objective(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO loss plus where the clip and the dual clip were the active branch.

    `torch.where` picks exactly one branch per token, so the gradient of the chosen branch passes whole
    (torch.maximum would split it in half on ties).
    """
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    clip_active = clipped > unclipped
    loss = torch.where(clip_active, clipped, unclipped)
    if dual_clip is None:
        return loss, clip_active, torch.zeros_like(clip_active)
    # Dual clip bounds the loss of a negative-advantage token whose ratio exploded (Ye et al. 2020).
    floor = -adv * dual_clip
    dual_active = (adv < 0) & (floor < loss)
    return torch.where(dual_active, floor, loss), clip_active, dual_active


def behaviour_weight(
    proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, max_is_weight: float | None
) -> tuple[torch.Tensor, int]:
    """Detached pi_prox/pi_behav, zeroed where non-finite (and that count, masked), optionally capped."""
    w = torch.exp((proximal - behaviour).detach())
    finite = torch.isfinite(w)
    n_bad = int((~finite & mask).sum())
    w = torch.where(finite, w, torch.zeros_like(w))
    if max_is_weight is not None:
        w = w.clamp(max=max_is_weight)
    return w, n_bad


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Reduce per-token losses; sequence-level means count only sequences with at least one token."""
    if aggregation == "token-mean":
        return masked_mean(per_token, mask)
    per_seq = (
        masked_mean(per_token, mask, dim=-1)
        if aggregation == "seq-mean-token-mean"
        else torch.where(mask, per_token, torch.zeros_like(per_token)).sum(-1)
    )
    return masked_mean(per_seq, mask.any(-1))


def ratio_stats(
    ratio: torch.Tensor, log_ratio: torch.Tensor, w: torch.Tensor, mask: torch.Tensor,
    clip_active: torch.Tensor, dual_active: torch.Tensor, n_bad: int,
) -> dict[str, float]:
    def mean(x: torch.Tensor) -> float:
        return float(masked_mean(x.detach().to(torch.float64), mask))

    def peak(x: torch.Tensor) -> float:
        return float(x.detach()[mask].max()) if bool(mask.any()) else 0.0

    return {
        "clip_fraction": mean(clip_active.to(torch.float64)),
        "dual_clip_fraction": mean(dual_active.to(torch.float64)),
        "ratio_mean": mean(ratio),
        "ratio_max": peak(ratio),
        "is_weight_mean": mean(w),
        "is_weight_max": peak(w),
        "nonfinite_is_weight": float(n_bad),
        # k3 estimator of KL(proximal || current): non-negative and low-variance.
        "approx_kl": mean((ratio - 1.0) - log_ratio),
    }
