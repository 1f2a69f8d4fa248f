"""CISPO (MiniMax-M1, 2025): clip the importance weight, never the gradient.

PPO's clip zeroes the gradient of every token whose ratio left the trust region, and in reasoning traces those
are often the rare tokens that matter (a "however", a "wait"). CISPO keeps every token's policy gradient and
bounds only its weight: loss = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * log pi per token, with r =
pi / pi_prox; its gradient is the clipped weight times A times grad log pi. As in `ppo`, the behaviour gap is
corrected by the detached w = pi_prox / pi_behav, and the tokens are aggregated as `algorithm.aggregation`
says. MiniMax bounded the weight from above only: a large `clip_low` (e.g. 0.99) with a `clip_high` of a few
tenths does that here. The loss's value is -clipped weight * A (not the log-prob), so it reads like PPO's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from drmas.algorithms.losses import (
    POLICY_LOSSES, LossInputs, LossOutput, aggregate, behaviour_weight, check_clips, prepare, ratio_stats,
)

if TYPE_CHECKING:
    from drmas.config.schema import AlgorithmConfig


@POLICY_LOSSES.register("cispo")
def cispo(inputs: LossInputs, alg: AlgorithmConfig) -> LossOutput:
    p = prepare(inputs, alg.aggregation)
    check_clips(alg.clip_low, alg.clip_high, None)
    ratio = torch.exp(p.log_ratio)
    weight = ratio.detach().clamp(1.0 - alg.clip_low, 1.0 + alg.clip_high)
    clipped = (weight != ratio.detach()) & p.mask
    # -sg(weight / r) * r * A: the value is -weight * A, the gradient -weight * A * grad log pi
    per_token = -(weight / ratio).detach() * ratio * p.adv
    w, n_bad = behaviour_weight(p.proximal, p.behaviour, p.mask, alg.max_is_weight)
    loss = aggregate(per_token * w, p.mask, alg.aggregation)
    stats = ratio_stats(ratio, p.log_ratio, w, p.mask, clipped, torch.zeros_like(clipped), n_bad)
    return LossOutput(loss, stats, "token" if alg.aggregation == "token-mean" else "sequence")
