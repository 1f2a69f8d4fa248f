"""How generation and training pace each other in an async run, read from its metrics: the figures that pick
`pipeline.num_rollouts`, `pipeline.max_staleness` and `rollout.prompts_per_step` (docs/pipeline.md, "Pacing").

- **Generation seconds per step**: one step's episodes (`prompts_per_step x group_size`) over what the run's
  rollouts make per second they are busy (episodes / busy seconds, from each rollout's `idle/rollout` and
  `throughput/rollout/episodes_per_s`, summed over rollouts: each has cores or a device of its own).
- **Update seconds**: a learner's median `time/<m>/update_seconds` after its first step (the first warms up).

Their ratio r says which side bounds the run. Below 1 the learner does: with a bound of 1 the rollouts make the
next step's groups during each update and wait for its weights, and the run gets (1 + r)x the steps of the
synchronous pipeline (`max_staleness: 0`), its ceiling. Above 1 the rollouts do and the learner waits a share
1 - 1/r of each step: more rollouts (about r times as many) keep it busy, a larger bound does not (in a steady
state it only lets the samples grow older). Kept apart from files and processes: `pace_of` takes records.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Pace:
    model: str
    generation_s: float  # seconds the run's rollouts take to generate one step's episodes
    update_s: float  # the learner's median update
    push_s: float  # its median weight push
    idle: float  # share of its steps it waited for a batch
    rollouts: int
    max_staleness: int

    @property
    def ratio(self) -> float:
        return self.generation_s / self.update_s if self.update_s > 0 else math.inf

    def scalars(self) -> dict[str, float]:
        m = self.model
        return {f"pace/{m}/generation_seconds": self.generation_s, f"pace/{m}/update_seconds": self.update_s,
                f"pace/{m}/generation_update_ratio": self.ratio, f"pace/{m}/learner_idle": self.idle}

    def line(self) -> str:
        r = self.ratio
        head = (f"pace of {self.model}: generation {self.generation_s:.1f} s / update {self.update_s:.1f} s a step "
                f"(r = {r:.2f}), learner idle {self.idle:.0%}")
        if r <= 1:
            advice = "the learner bounds the run"
            if self.max_staleness == 0:
                advice += f"; pipeline.max_staleness=1 would overlap generation with the update (up to {1 + r:.2f}x)"
            elif self.rollouts > 1 and r * self.rollouts <= self.rollouts - 1:
                advice += f"; {math.ceil(r * self.rollouts)} rollout(s) would keep up"
        else:
            need = math.ceil(r * self.rollouts)
            advice = f"the rollouts bound the run: about {need} rollout(s) (now {self.rollouts}) would keep the learner busy"
        if self.push_s > 0.1 * self.update_s:
            advice += (f"; the push takes {self.push_s / self.update_s:.0%} of an update: more rollout.prompts_per_step "
                       "would spread it")
        return f"{head}: {advice}"


def rollout_capacity(records: Sequence[dict]) -> tuple[float, float]:
    """(episodes, busy seconds) of one rollout's metrics records: each record covers the time since the one
    before it (the first, since a start the records do not hold, is skipped)."""
    episodes = busy = 0.0
    for before, record in zip(records, records[1:]):
        span = float(record["time"]) - float(before["time"])
        if span <= 0 or "idle/rollout" not in record:
            continue
        episodes += float(record.get("throughput/rollout/episodes_per_s", 0.0)) * span
        busy += (1.0 - float(record["idle/rollout"])) * span
    return episodes, busy


def pace_of(model: str, learner: Sequence[dict], rollouts: Sequence[Sequence[dict]], episodes_per_step: int,
            max_staleness: int) -> Pace | None:
    """The pace of `model` from its learner's records and each rollout's; None before the learner's second
    step or the rollouts' first busy second."""
    steps = [r for r in learner[1:] if f"time/{model}/update_seconds" in r]
    totals = [rollout_capacity(r) for r in rollouts]
    episodes, busy = sum(e for e, _ in totals), sum(b for _, b in totals)
    if not steps or episodes <= 0 or busy <= 0:
        return None
    per_rollout = episodes / busy  # episodes per busy second of one rollout, on average
    return Pace(
        model=model,
        generation_s=episodes_per_step / (per_rollout * len(rollouts)),
        update_s=statistics.median(float(r[f"time/{model}/update_seconds"]) for r in steps),
        push_s=statistics.median(float(r.get(f"weight_sync/{model}/seconds", 0.0)) for r in steps),
        idle=statistics.fmean(float(r.get(f"idle/{model}", 0.0)) for r in steps),
        rollouts=len(rollouts),
        max_staleness=max_staleness,
    )
