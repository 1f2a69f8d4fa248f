"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the ratio and its clip per sequence.

PPO clips each token's ratio, so a long reply's gradient is a sum of many noisy token-level corrections;
GSPO takes one ratio per sequence, the geometric mean of its tokens' ratios s = exp(mean_t log(pi / pi_prox)),
and clips that, matching the sequence-level reward it weighs. Its gradient is s * A * mean_t grad log pi.
The clip range is of another order than PPO's: the paper used 3e-4 / 4e-4 (`algorithm.clip_low` /
`clip_high`), since a mean log-ratio moves far less than a token's. The behaviour gap is corrected per
sequence as well, by the detached geometric mean of pi_prox / pi_behav (capped by `max_is_weight`); the dual
clip bounds a negative-advantage sequence whose ratio exploded. The loss is the mean over sequences.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from drmas.algorithms.losses import (
    POLICY_LOSSES, LossInputs, LossOutput, behaviour_weight, check_clips, clipped_objective, masked_mean, prepare,
    ratio_stats,
)

if TYPE_CHECKING:
    from drmas.config.schema import AlgorithmConfig


@POLICY_LOSSES.register("gspo")
def gspo(inputs: LossInputs, alg: AlgorithmConfig) -> LossOutput:
    p = prepare(inputs)
    check_clips(alg.clip_low, alg.clip_high, alg.dual_clip)
    has = p.mask.any(-1)
    n_tokens = p.mask.sum(-1).clamp(min=1)
    seq_log_ratio = p.log_ratio.sum(-1) / n_tokens
    ratio = torch.exp(seq_log_ratio)
    adv = masked_mean(p.adv, p.mask, dim=-1)  # one advantage per sequence (its tokens share it)
    per_seq, clip_active, dual_active = clipped_objective(ratio, adv, alg.clip_low, alg.clip_high, alg.dual_clip)
    gap = torch.where(p.mask, p.proximal - p.behaviour, torch.zeros_like(p.proximal)).sum(-1) / n_tokens
    w, n_bad = behaviour_weight(gap, torch.zeros_like(gap), has, alg.max_is_weight)
    loss = masked_mean(per_seq * w, has)
    return LossOutput(loss, ratio_stats(ratio, seq_log_ratio, w, has, clip_active, dual_active, n_bad), "sequence")
