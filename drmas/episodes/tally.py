"""What the finished training episodes say, as metrics: the mean task reward and the mean of each numeric entry an
orchestra reports in `EpisodeOutcome.info` (math: `rounds`, `approved`; a plugin's: whatever it counts).

Both loops log them (`episode/reward_mean`, `episode/info/<key>`): the colocated loop per step, a rollout process
per report, over the episodes it finished since its last. A plugin author can so watch e.g. a critic's accuracy in
TensorBoard while training, not only in `drmas eval`. Booleans count as 0/1; strings, lists, None and non-finite
values are left out; a key is averaged over the episodes that report it. Dropped episodes (a plugin failure or a
bound) are not counted: `rollout/episodes_failed` counts them.
"""

from __future__ import annotations

import math
from numbers import Real

from drmas.mas.base import EpisodeOutcome


def is_number(value: object) -> bool:
    """A finite int, float or bool (numpy scalars included); strings, lists, None and NaN are not."""
    return isinstance(value, (Real, bool)) and math.isfinite(float(value))  # type: ignore[arg-type]


class EpisodeTally:
    """Sums over the episodes added since the last `reset`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.episodes = 0
        self.reward_sum = 0.0
        self.info_sums: dict[str, float] = {}
        self.info_counts: dict[str, int] = {}

    def add(self, outcome: EpisodeOutcome) -> None:
        if outcome.dropped:
            return
        self.episodes += 1
        self.reward_sum += float(outcome.reward)
        for key, value in (outcome.info or {}).items():
            if is_number(value):
                self.info_sums[key] = self.info_sums.get(key, 0.0) + float(value)
                self.info_counts[key] = self.info_counts.get(key, 0) + 1

    def scalars(self) -> dict[str, float]:
        """`episode/reward_mean`, `episode/count` and `episode/info/<key>`; {} before any episode."""
        if not self.episodes:
            return {}
        out = {"episode/reward_mean": self.reward_sum / self.episodes, "episode/count": float(self.episodes)}
        out.update({f"episode/info/{k}": self.info_sums[k] / self.info_counts[k] for k in self.info_sums})
        return out
