"""Statistics of the stability benchmark: per-agent advantage second moments, the paper's prediction for
them, gradient-spike shares and seed summaries.

Kept apart from `bench/stability.py` (which runs training) so they can be checked on hand-built inputs
(`tests/test_stability_stats.py`) and reused on any run's samples.

Why these definitions:
- A normalisation *set* is what a mode divides by: `agent` = the calls of one agent in one prompt group,
  `step_global` = all calls of the group, `global` = the group's trajectories, each call carrying its
  trajectory's score (mean reward of its calls). Only sets with spread (two or more members, non-zero std)
  are counted: a constant set gives every member A = 0 by definition, a singleton is normalised by other
  statistics (running ones) and has no moments of its own; both would only dilute the comparison.
- The paper's formula: when agent k's values in a set have mean mu_k and (population) variance sigma_k^2,
  and the set has mean mu and std sigma, then E[A_k^2] = (sigma_k^2 + (mu_k - mu)^2) / sigma^2. Applied per
  (set, agent) cell and weighted by the cell's calls, it is exact (up to eps) for the advantages the mode
  really computes, so "measured" and "predicted" must agree; the two terms say *why* an agent is mis-scaled:
  its own spread (`spread_term`) or its offset from the set's mean (`offset_term`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from drmas.runtime.metrics import spike_summary


@dataclass
class SetView:
    """Per call: the value its mode normalises, the key of its normalisation set, and that set's moments."""

    value: np.ndarray  # own reward (agent, step_global) or its trajectory's score (global)
    set_key: list[str]
    set_mean: np.ndarray
    set_std: np.ndarray  # unbiased; nan for a one-member set
    set_size: np.ndarray

    @property
    def spread(self) -> np.ndarray:
        """Calls whose set has two or more members and a non-zero std."""
        return (self.set_size >= 2) & (np.nan_to_num(self.set_std) > 0)


def _moments(values: Iterable[float]) -> tuple[float, float, int]:
    """(mean, unbiased std or nan, count); a constant set gets its exact value and std 0 (a summed mean of
    equal floats can be off by an ulp and leave a spurious 1e-17 std)."""
    arr = np.asarray(list(values), dtype=np.float64)
    if arr.size > 1 and arr.min() == arr.max():
        return float(arr[0]), 0.0, int(arr.size)
    std = float(arr.std(ddof=1)) if arr.size > 1 else math.nan
    return float(arr.mean()), std, int(arr.size)


def set_view(mode: str, rewards: Sequence[float], groups: Sequence[str], agents: Sequence[str],
             trajs: Sequence[str]) -> SetView:
    """The normalisation sets of `mode` (see the module docstring), computed independently of
    `drmas.algorithms.advantage` so that the two can check each other."""
    r = np.asarray(rewards, dtype=np.float64)
    n = r.size
    if mode in ("agent", "step_global"):
        keys = [f"{g}\x00{a}" if mode == "agent" else str(g) for g, a in zip(groups, agents)]
        members: dict[str, list[float]] = defaultdict(list)
        for key, value in zip(keys, r):
            members[key].append(float(value))
        value = r
    elif mode == "global":
        calls: dict[tuple[str, str], list[float]] = defaultdict(list)
        for g, t, v in zip(groups, trajs, r):
            calls[(str(g), str(t))].append(float(v))
        score = {key: float(np.mean(v)) for key, v in calls.items()}
        keys = [str(g) for g in groups]
        members = defaultdict(list)
        for (g, _), s in score.items():
            members[g].append(s)
        value = np.array([score[(str(g), str(t))] for g, t in zip(groups, trajs)], dtype=np.float64)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    stats = {key: _moments(v) for key, v in members.items()}
    return SetView(
        value=value, set_key=keys,
        set_mean=np.array([stats[k][0] for k in keys]).reshape(n),
        set_std=np.array([stats[k][1] for k in keys]).reshape(n),
        set_size=np.array([stats[k][2] for k in keys]).reshape(n),
    )


def measured_second_moment(advantages: Sequence[float], agents: Sequence[str], view: SetView) -> dict[str, dict]:
    """Per agent: mean of A^2 over its calls in sets with spread, and how many calls that is."""
    adv = np.asarray(advantages, dtype=np.float64)
    agents_arr = np.asarray(agents, dtype=str)
    out = {}
    for agent in sorted(set(agents_arr.tolist())):
        hit = (agents_arr == agent) & view.spread
        out[agent] = {"sq_mean": float(np.mean(adv[hit] ** 2)) if hit.any() else math.nan, "calls": int(hit.sum())}
    return out


def predicted_second_moment(agents: Sequence[str], view: SetView) -> dict[str, dict]:
    """Per agent: the formula (sigma_k^2 + (mu_k - mu)^2) / sigma^2 per (set, agent) cell, averaged over the
    cells weighted by their calls; `spread_term` and `offset_term` are its two parts (they add up)."""
    cells: dict[tuple[str, str], list[int]] = defaultdict(list)
    spread = view.spread
    for i, (key, agent) in enumerate(zip(view.set_key, agents)):
        if spread[i]:
            cells[(str(agent), key)].append(i)
    acc: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])  # calls, spread sum, offset sum
    for (agent, _), idx in cells.items():
        x = view.value[idx]
        var_set = view.set_std[idx[0]] ** 2
        a = acc[agent]
        a[0] += len(idx)
        a[1] += len(idx) * float(x.var()) / var_set
        a[2] += len(idx) * (float(x.mean()) - view.set_mean[idx[0]]) ** 2 / var_set
    out = {}
    for agent in sorted(set(map(str, agents))):
        calls, s, o = acc.get(agent, (0.0, 0.0, 0.0))
        if calls == 0:
            out[agent] = {"predicted": math.nan, "spread_term": math.nan, "offset_term": math.nan, "calls": 0}
        else:
            out[agent] = {"predicted": (s + o) / calls, "spread_term": s / calls, "offset_term": o / calls,
                          "calls": int(calls)}
    return out


def spike_share(values: Sequence[float], factor: float = 3.0) -> dict[str, float]:
    """Median, max, and the share of steps (from the second on) whose value is above `factor` x the median
    of the non-zero steps before it (drmas.runtime.metrics.spike_summary's count, as a share so runs of any
    length compare)."""
    summary = spike_summary(list(values), factor)
    finite = sum(1 for v in values if math.isfinite(v))
    share = summary["spikes"] / (finite - 1) if finite > 1 else math.nan
    return {"median": summary["median"], "max": summary["max"], "spike_share": share}


def over_seeds(values: Sequence[float]) -> dict[str, float]:
    """Mean and spread (sample std, min, max) of one figure over seeds; nan entries are left out."""
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return {"mean": math.nan, "std": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {"mean": float(arr.mean()), "std": float(arr.std(ddof=1)) if arr.size > 1 else 0.0,
            "min": float(arr.min()), "max": float(arr.max()), "n": int(arr.size)}
