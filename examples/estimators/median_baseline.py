"""An advantage estimator as a plugin: `agent_median`, each call's reward minus the median reward of the same
agent's calls in its prompt group (its own included), a baseline one outlier episode cannot drag. A call alone
in its set gets 0. Load it with `plugins: [path/to/median_baseline.py]`, choose it with
`algorithm.estimator: agent_median`; it imports nothing of drmas but `drmas.api` (docs/algorithms.md)."""

from __future__ import annotations

import numpy as np

from drmas.api import ADVANTAGE_ESTIMATORS, AdvantageBatch, EstimatorContext


@ADVANTAGE_ESTIMATORS.register("agent_median")
def agent_median(batch: AdvantageBatch, context: EstimatorContext) -> np.ndarray:
    """One advantage per row of `batch` (the calls one model trains this step). `context` (the algorithm
    section, the running reward statistics) is not needed: no std division, no one-call fallback."""
    sets: dict[tuple[str, str], list[int]] = {}
    for row, key in enumerate(zip(batch.group.tolist(), batch.agent.tolist())):
        sets.setdefault(key, []).append(row)
    adv = np.zeros(len(batch))
    for rows in sets.values():
        if len(rows) > 1:
            adv[rows] = batch.reward[rows] - np.median(batch.reward[rows])
    return adv
