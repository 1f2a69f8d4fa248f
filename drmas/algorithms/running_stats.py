"""Streaming per-agent reward statistics.

Samples reach the learner continuously and from several policy versions, so a per-prompt group is
sometimes too small to normalise on its own (a singleton group has no spread at all). A running
mean/std per agent gives those cases a sensible baseline, and doubles as a monitoring signal: an
agent whose reward mean drifts away from the others' is exactly the case Dr. MAS is built for.

Two forms are offered because they answer different questions:
- a sliding window (default, last `window` rewards per agent) follows the *current* policy, since old
  rewards fall out as the policy improves;
- `window=0` keeps unbounded statistics with Welford/Chan updates, for whole-run summaries.
The pooled key `"__all__"` sees every reward, so modes that do not split by agent have a baseline too.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Iterable

import numpy as np

ALL = "__all__"


class _Window:
    """The last `size` rewards of one key; mean/std are recomputed two-pass, so no drift accumulates."""

    def __init__(self, size: int, values: Iterable[float] = ()) -> None:
        self.values: deque[float] = deque(values, maxlen=size)

    def add(self, batch: np.ndarray) -> None:
        self.values.extend(batch.tolist())

    def count(self) -> int:
        return len(self.values)

    def moments(self) -> tuple[float, float]:
        """(mean, unbiased std); nan where undefined, so callers must check `count` first."""
        n = len(self.values)
        if n == 0:
            return math.nan, math.nan
        arr = np.fromiter(self.values, dtype=np.float64, count=n)
        mean = float(arr.mean())
        std = float(arr.std(ddof=1)) if n > 1 else math.nan
        return mean, std

    def state(self) -> dict[str, Any]:
        return {"values": list(self.values)}


class _Welford:
    """Unbounded statistics merged batch-wise with Chan et al.'s parallel formula (stable, O(1) memory)."""

    def __init__(self, count: int = 0, mean: float = 0.0, m2: float = 0.0) -> None:
        self.n, self.mean, self.m2 = int(count), float(mean), float(m2)

    def add(self, batch: np.ndarray) -> None:
        nb = batch.size
        if nb == 0:
            return
        mean_b = float(batch.mean())
        m2_b = float(((batch - mean_b) ** 2).sum())
        total = self.n + nb
        delta = mean_b - self.mean
        self.mean += delta * nb / total
        self.m2 += m2_b + delta * delta * self.n * nb / total
        self.n = total

    def count(self) -> int:
        return self.n

    def moments(self) -> tuple[float, float]:
        if self.n == 0:
            return math.nan, math.nan
        std = math.sqrt(max(self.m2, 0.0) / (self.n - 1)) if self.n > 1 else math.nan
        return self.mean, std

    def state(self) -> dict[str, Any]:
        return {"count": self.n, "mean": self.mean, "m2": self.m2}


class AgentRewardStats:
    """Per-agent (plus pooled `"__all__"`) reward mean/std over a sliding window or the whole stream.

    Agent ids are kept as strings (ints are converted), matching how advantages look them up.
    Unknown agents report count 0 and nan mean/std; std needs at least two rewards.
    """

    def __init__(self, window: int = 1024) -> None:
        if not isinstance(window, int) or window < 0:
            raise ValueError(f"window must be a non-negative int (0 = unbounded), got {window!r}")
        self.window = window
        self._stats: dict[str, _Window | _Welford] = {}

    def _new(self) -> _Window | _Welford:
        return _Window(self.window) if self.window > 0 else _Welford()

    def update(self, agent_ids: Iterable[str], rewards: Iterable[float]) -> None:
        """Add one batch of rewards; order within each agent is kept, so the window evicts the oldest."""
        agents = np.asarray(list(agent_ids), dtype=str)
        values = np.asarray(list(rewards), dtype=np.float64)
        if agents.shape != values.shape or agents.ndim != 1:
            raise ValueError(
                f"agent_ids ({agents.size}) and rewards ({values.size}) must be 1-D and equal in length"
            )
        if not np.isfinite(values).all():
            raise ValueError("rewards contain non-finite values (nan/inf); refusing to corrupt the statistics")
        if (agents == ALL).any():
            raise ValueError(f"{ALL!r} is reserved for the pooled statistics and cannot be an agent id")
        if values.size == 0:
            return
        uniq, inverse = np.unique(agents, return_inverse=True)
        for code, agent in enumerate(uniq.tolist()):
            self._stats.setdefault(agent, self._new()).add(values[inverse == code])
        self._stats.setdefault(ALL, self._new()).add(values)

    def count(self, agent: str) -> int:
        stats = self._stats.get(str(agent))
        return stats.count() if stats is not None else 0

    def mean(self, agent: str) -> float:
        stats = self._stats.get(str(agent))
        return stats.moments()[0] if stats is not None else math.nan

    def std(self, agent: str) -> float:
        """Unbiased (ddof=1) standard deviation; nan with fewer than two rewards."""
        stats = self._stats.get(str(agent))
        return stats.moments()[1] if stats is not None else math.nan

    def agents(self) -> list[str]:
        """Agents seen so far, sorted, without the pooled key."""
        return sorted(a for a in self._stats if a != ALL)

    def summary(self) -> dict[str, dict[str, float]]:
        """{key: {"mean", "std", "count"}} for every agent and the pooled `"__all__"` key (for logging)."""
        out: dict[str, dict[str, float]] = {}
        for key in sorted(self._stats):
            mean, std = self._stats[key].moments()
            out[key] = {"mean": mean, "std": std, "count": float(self._stats[key].count())}
        return out

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; Python floats round-trip through JSON exactly, so a restore is exact."""
        return {"window": self.window, "stats": {k: v.state() for k, v in self._stats.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the statistics with a saved state; the window must match to avoid silent reconfiguration."""
        if int(state["window"]) != self.window:
            raise ValueError(
                f"state was saved with window={state['window']}, this object has window={self.window}"
            )
        if self.window > 0:
            self._stats = {k: _Window(self.window, v["values"]) for k, v in state["stats"].items()}
        else:
            self._stats = {k: _Welford(v["count"], v["mean"], v["m2"]) for k, v in state["stats"].items()}
