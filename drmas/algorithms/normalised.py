"""The built-in estimators that centre (and scale) rewards by a set's statistics: the GRPO family.

- `agent` (Dr. MAS): each call's reward against the calls of the same agent in its prompt group, so no agent's
  advantage scale depends on another agent's reward level or spread.
- `global` (GRPO): each episode's trajectory score (mean reward of all its calls) against the group's
  episodes; every call of an episode takes its episode's advantage.
- `step_global`: each call's reward against every call of its group, agents pooled (separates "split by
  agent" from "score calls, not episodes" in ablations).
- `dr_grpo` (Dr. GRPO): `global` centred only; dividing by the group's std up-weights groups that are nearly
  all right or all wrong.
- `batch` (REINFORCE++ with a group baseline): `dr_grpo`'s centred scores divided by their std over the whole
  batch, so one scale holds for every group of the step.

`algorithm.norm_by_std` applies to the first three; a one-member set is centred (and scaled) by the running
statistics of earlier steps as `algorithm.singleton_fallback` says.
"""

from __future__ import annotations

import numpy as np

from drmas.algorithms.advantage import set_codes
from drmas.algorithms.estimators import ADVANTAGE_ESTIMATORS, AdvantageBatch, EstimatorContext
from drmas.algorithms.running_stats import ALL


@ADVANTAGE_ESTIMATORS.register("agent")
def agent(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    codes, first = set_codes(batch.group, batch.agent)
    return ctx.normalise(batch.reward, codes, batch.reward, codes, batch.agent[first])


@ADVANTAGE_ESTIMATORS.register("step_global")
def step_global(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    pool, pool_codes, codes = batch.group_pool()
    return ctx.normalise(batch.reward, codes, pool, pool_codes, np.full(int(codes.max()) + 1, ALL))


def _episodes_centred(batch: AdvantageBatch, ctx: EstimatorContext, by_std: bool | None) -> np.ndarray:
    """Each row's episode score against the scores of its group's episodes."""
    scores, groups, of_call = batch.episodes()
    codes, first = set_codes(groups)
    adv = ctx.normalise(scores, codes, scores, codes, np.full(first.size, ALL), by_std=by_std)
    return adv[of_call]


@ADVANTAGE_ESTIMATORS.register("global")
def global_(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    return _episodes_centred(batch, ctx, None)


@ADVANTAGE_ESTIMATORS.register("dr_grpo")
def dr_grpo(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    return _episodes_centred(batch, ctx, False)


@ADVANTAGE_ESTIMATORS.register("batch")
def batch_(batch: AdvantageBatch, ctx: EstimatorContext) -> np.ndarray:
    centred = _episodes_centred(batch, ctx, False)
    if centred.size < 2:
        return centred
    std = float(centred.std(ddof=1))
    return centred / (std + ctx.alg.eps) if std > 0 else centred
