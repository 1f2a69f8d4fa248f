"""The built-in leave-one-out estimators: a baseline that never contains the scored sample itself.

- `rloo` (RLOO, Ahmadian et al. 2024): an episode's trajectory score minus the mean score of the group's
  other episodes, i.e. n/(n-1) times its distance from the group mean; every call of the episode takes it.
  Unbiased (the baseline is independent of the sample) and unscaled.
- `agent_rloo`: per agent, as Dr. MAS splits normalisation: a call's reward minus the mean reward of the same
  agent's calls in the group's other episodes (not its own episode's, whose calls share its outcome).

A row with nothing to leave one out from (a one-episode group; an agent that spoke in one episode of its
group only) is centred on the running mean of earlier steps (its agent's for `agent_rloo`, the pooled one
for `rloo`; 0 while unknown or with `singleton_fallback: false`) and bounded by `singleton_clip`.
"""

from __future__ import annotations

import numpy as np

from drmas.algorithms.advantage import set_codes, set_moments
from drmas.algorithms.estimators import ADVANTAGE_ESTIMATORS, AdvantageBatch, EstimatorContext
from drmas.algorithms.running_stats import ALL


@ADVANTAGE_ESTIMATORS.register("rloo")
def rloo(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    scores, groups, of_call = batch.episodes()
    codes, _ = set_codes(groups)
    count, mean, _ = set_moments(scores, codes)  # the exact mean of a constant group: exactly 0 below
    n = count[codes].astype(np.float64)
    adv = np.where(n > 1, (scores - mean[codes]) * n / np.maximum(n - 1, 1), 0.0)
    alone = n == 1
    adv[alone] = ctx.clip_single(scores[alone] - ctx.baseline(ALL))
    return adv[of_call]


@ADVANTAGE_ESTIMATORS.register("agent_rloo")
def agent_rloo(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    r = batch.reward
    sets, _ = set_codes(batch.group, batch.agent)
    own, _ = set_codes(batch.group, batch.agent, batch.episode)
    total, count = np.bincount(sets, weights=r), np.bincount(sets)
    own_total, own_count = np.bincount(own, weights=r), np.bincount(own)
    others = (count[sets] - own_count[own]).astype(np.float64)
    baseline = (total[sets] - own_total[own]) / np.maximum(others, 1)
    _, _, std = set_moments(r, sets)
    adv = np.where(std[sets] == 0, 0.0, r - baseline)  # equal rewards: exactly 0, whatever the float sums say
    for i in np.flatnonzero(others == 0):
        adv[i] = ctx.clip_single(np.array(r[i] - ctx.baseline(str(batch.agent[i]))))
    return adv
