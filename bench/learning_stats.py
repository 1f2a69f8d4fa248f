"""Statistics of the learning benchmark: intervals of a held-out accuracy and of its gain.

Kept apart from `bench/learning.py` (which trains) so they can be checked on hand-built inputs.

Why these definitions:
- One accuracy is a proportion over n greedy problems: its 95% interval is Wilson's, which stays inside
  [0, 1] and keeps its coverage near 0 and 1, where the normal interval does not.
- Before and after score the *same* problems, so the gain's standard error is the paired one: the standard
  error of the mean of the per-problem differences d_i = after_i - before_i in {-1, 0, 1}. It is smaller
  than the unpaired sqrt(p1 q1 / n + p2 q2 / n) when both evaluations get the same problems right, which
  is the usual case. Both are reported; the unpaired one is the conservative figure.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

Z95 = 1.959963984540054
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def t95(n: int) -> float:
    """The two-sided 95% Student t quantile for a mean over n values (n - 1 degrees of freedom; nan below 2).
    A table to 10 degrees of freedom, then z + 2.4 / df + 2.5 / df^2, within 0.2% of the exact quantile."""
    if n < 2:
        return math.nan
    df = n - 1
    return _T95.get(df, Z95 + 2.4 / df + 2.5 / df**2)


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a proportion (nan, nan for n = 0)."""
    if n <= 0:
        return math.nan, math.nan
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy(scores: Sequence[float]) -> dict[str, float]:
    """Mean of per-problem scores (1 right, 0 wrong) with its Wilson 95% interval."""
    arr = np.asarray(scores, dtype=np.float64)
    low, high = wilson(float(arr.sum()), arr.size)
    return {"accuracy": float(arr.mean()) if arr.size else math.nan, "low": low, "high": high, "n": int(arr.size)}


def gain(before: Sequence[float], after: Sequence[float]) -> dict[str, float]:
    """after - before on the same problems: the gain, its paired and unpaired standard errors, the paired
    95% normal interval, gain / paired SE, and the problems that turned right and turned wrong."""
    b, a = np.asarray(before, dtype=np.float64), np.asarray(after, dtype=np.float64)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"gain needs the same >= 2 problems before and after, got {b.size} and {a.size}")
    n = a.size
    d = a - b
    paired = float(d.std(ddof=1) / math.sqrt(n))
    pb, pa = b.mean(), a.mean()
    unpaired = math.sqrt(pb * (1 - pb) / n + pa * (1 - pa) / n)
    mean = float(d.mean())
    return {"gain": mean, "se_paired": paired, "se_unpaired": unpaired,
            "low": mean - Z95 * paired, "high": mean + Z95 * paired,
            "z_paired": mean / paired if paired > 0 else math.nan,
            "z_unpaired": mean / unpaired if unpaired > 0 else math.nan,
            "turned_right": int((d > 0).sum()), "turned_wrong": int((d < 0).sum()), "n": n}
