"""Deterministic, resumable order in which training problems are drawn.

Epoch e visits the train split in a permutation seeded by (seed, e); the whole state is one integer
(how many problems were drawn), so a resumed run continues with exactly the problems it would have seen.
"""

from __future__ import annotations

import random
from typing import Sequence

from drmas.tasks.base import Problem


class ProblemSampler:
    def __init__(self, problems: Sequence[Problem], seed: int) -> None:
        if not problems:
            raise ValueError("the training split has no problems")
        self.problems = list(problems)
        self.seed = seed
        self.drawn = 0
        self._epoch = -1
        self._order: list[int] = []

    def next(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.drawn, len(self.problems))
            if epoch != self._epoch:
                self._order = list(range(len(self.problems)))
                random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
                self._epoch = epoch
            out.append(self.problems[self._order[pos]])
            self.drawn += 1
        return out

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state["drawn"])
