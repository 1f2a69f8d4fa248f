"""Group-relative advantages over arrays: vanilla GRPO, Dr. MAS agent-wise, and step-level global normalisation.

Why three modes: `global` is the GRPO baseline (one score per trajectory), `agent` is the Dr. MAS fix
(each agent normalised against its own calls in the group, so no agent's E[A^2] is inflated by another
agent's reward level), and `step_global` pools every call of the group without splitting by agent, which
separates "split by agent" from "step-level weighting" in ablations.
Everything is a handful of vectorised numpy passes (np.unique + bincount), so 100k samples are cheap. The
registered estimators the loops call (`drmas.algorithms.estimators`) are built from these set operations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np


if TYPE_CHECKING:
    from drmas.algorithms.running_stats import AgentRewardStats

_POOLED = "__all__"
MODES = ("agent", "global", "step_global")  # compute_advantages' modes (the estimators of those names)


def ids(values: Any, name: str) -> np.ndarray:
    """1-D id array; mixed-type object arrays become strings so np.unique can sort them."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr.astype(str) if arr.dtype == object else arr


def set_codes(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dense int code of each row's key tuple, plus the index of each code's first row."""
    combined = np.zeros(keys[0].shape[0], dtype=np.int64)
    for key in keys:
        _, inv = np.unique(key, return_inverse=True)
        combined = combined * (int(inv.max(initial=0)) + 1) + inv.reshape(-1)
    _, first, inv = np.unique(combined, return_index=True, return_inverse=True)
    return inv.reshape(-1), first


def set_moments(values: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-set (count, mean, unbiased std) by two passes; constant sets get their exact value as mean.

    The exact mean matters: sum/count of equal floats can be off by one ulp, which would turn a
    constant set's "0 advantage" into a tiny-over-tiny ratio of order 1e-11 instead of exactly 0.
    """
    count = np.bincount(codes)
    mean = np.bincount(codes, weights=values) / count
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate(([0], np.cumsum(count)[:-1]))
    lo = np.minimum.reduceat(values[order], starts)
    hi = np.maximum.reduceat(values[order], starts)
    mean = np.where(lo == hi, lo, mean)
    sq_dev = np.bincount(codes, weights=(values - mean[codes]) ** 2, minlength=count.size)
    std = np.sqrt(sq_dev / np.maximum(count - 1, 1))
    return count, mean, std


def _singleton_baseline(
    keys: np.ndarray, running_stats: AgentRewardStats | None
) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) for one-element sets: the running stats of `keys` if known, else the reference 0/1.

    The reference's mean 0 / std 1 hands out the raw reward as advantage (biased: always positive for
    0/1 rewards). The running stats of the same agent are a far better baseline once they exist. A
    running std of exactly 0 carries no scale information, so there only the mean is used (std 1).
    `running_stats` must hold earlier rewards only (callers update it after this batch's advantages): a
    baseline that contains the sample's own reward pulls the advantage towards 0.
    """
    mean, std = np.zeros(keys.size), np.ones(keys.size)
    if running_stats is None:
        return mean, std
    for key in np.unique(keys).tolist():
        if running_stats.count(key) < 2:
            continue
        hit = keys == key
        mean[hit] = running_stats.mean(key)
        run_std = running_stats.std(key)
        std[hit] = run_std if np.isfinite(run_std) and run_std > 0 else 1.0
    return mean, std


def _normalise(
    values: np.ndarray, codes: np.ndarray, stat_keys: np.ndarray, norm_by_std: bool, eps: float,
    running_stats: AgentRewardStats | None, singleton_clip: float | None,
) -> np.ndarray:
    """Advantage of each value against the statistics of its set (sets given by `codes`)."""
    return normalise_to(values, codes, values, codes, stat_keys, norm_by_std, eps, running_stats, singleton_clip)


def normalise_to(
    values: np.ndarray, codes: np.ndarray, pool: np.ndarray, pool_codes: np.ndarray, stat_keys: np.ndarray,
    norm_by_std: bool, eps: float, running_stats: AgentRewardStats | None, singleton_clip: float | None,
) -> np.ndarray:
    """Advantage of each value against the statistics of its set in `pool` (`codes` and `pool_codes` index the
    same dense sets 0..K-1, every set present in the pool; `stat_keys[k]`: the running-statistics key of set k).

    The pool may hold more than the values: a learner scores its own calls against every call of their group.
    A one-element set's advantage is clipped to +-`singleton_clip`: against running statistics one
    failure of a nearly always right agent (mean 0.99, std 0.03) would otherwise weigh -33, while no
    member of a real group of n can exceed (n - 1) / sqrt(n) (2.5 for n = 8).
    """
    count, mean, std = set_moments(pool, pool_codes)
    single = count == 1
    if single.any():
        mean[single], std[single] = _singleton_baseline(stat_keys[single], running_stats)
    centred = values - mean[codes]
    if norm_by_std:
        # where=...: with eps=0 a constant set would otherwise give 0/0 = nan instead of 0.
        centred = np.divide(centred, std[codes] + eps, out=np.zeros_like(centred), where=centred != 0)
    if singleton_clip is not None and single.any():
        alone = single[codes]
        centred[alone] = np.clip(centred[alone], -singleton_clip, singleton_clip)
    return centred


def _validate(rewards: Any, ids: Sequence[tuple[str, Any]], mode: str, eps: float) -> np.ndarray:
    """Fail loudly on bad input: a silent nan or misaligned id would corrupt a whole batch's gradients."""
    if mode not in MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; expected one of {MODES}")
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {r.shape}")
    lengths = {"rewards": r.size, **{name: np.shape(v)[0] if np.ndim(v) else -1 for name, v in ids}}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"inputs must have equal lengths, got {lengths}")
    if not np.isfinite(r).all():
        raise ValueError(f"rewards contain {int((~np.isfinite(r)).sum())} non-finite value(s)")
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    return r


def compute_advantages(
    rewards: Any, group_ids: Any, agent_ids: Any, traj_ids: Any, mode: str = "agent",
    norm_by_std: bool = True, eps: float = 1e-6, running_stats: AgentRewardStats | None = None,
    singleton_clip: float | None = None,
) -> np.ndarray:
    """One float64 advantage per sample (agent call); see the module docstring for the modes.

    `running_stats` (rewards of earlier batches only) and `singleton_clip` only change one-element
    normalisation sets: agent mode uses that agent's running statistics, the other modes the pooled
    `"__all__"` entry, and the result is bounded by +-`singleton_clip` (None: unbounded). Trajectories are
    keyed by (group, traj).
    """
    named = (("group_ids", group_ids), ("agent_ids", agent_ids), ("traj_ids", traj_ids))
    r = _validate(rewards, named, mode, eps)
    if singleton_clip is not None and not singleton_clip > 0:
        raise ValueError(f"singleton_clip must be > 0 (or None), got {singleton_clip}")
    if r.size == 0:
        return np.zeros(0, dtype=np.float64)
    groups, agents, trajs = (ids(v, n) for n, v in named)
    pooled = np.full(r.size, _POOLED)
    if mode == "agent":
        codes, first = set_codes(groups, agents)
        return _normalise(r, codes, agents[first].astype(str), norm_by_std, eps, running_stats, singleton_clip)
    if mode == "step_global":
        codes, first = set_codes(groups)
        return _normalise(r, codes, pooled[first], norm_by_std, eps, running_stats, singleton_clip)
    traj_codes, traj_first = set_codes(groups, trajs)
    scores = set_moments(r, traj_codes)[1]  # exact mean for constant trajectories, as for sets
    group_codes, first = set_codes(groups[traj_first])
    traj_adv = _normalise(scores, group_codes, pooled[first], norm_by_std, eps, running_stats, singleton_clip)
    return traj_adv[traj_codes]
