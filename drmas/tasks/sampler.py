"""The run's one drawing order of training problems: draw number -> problem, deterministic and resumable.

Epoch e visits the train split in a permutation seeded by (seed, e), so draw d is problem
``perm(seed, d // n)[d % n]`` of an n-problem split: a pure function of the seed and the draw number. The
colocated loop draws 0, 1, 2, ... (its whole state is how many it drew); the asynchronous pipeline's buffer
hands out draw numbers and every rollout maps them with `at`, so both modes train on the same prompts in
the same order, and a resumed run continues with exactly the problems it would have seen (see
`drmas.core.draws`).
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

    def at(self, draw: int) -> Problem:
        """The problem of draw number `draw` (>= 0)."""
        if draw < 0:
            raise ValueError(f"draw numbers are >= 0, got {draw}")
        epoch, pos = divmod(draw, len(self.problems))
        if epoch != self._epoch:
            self._order = list(range(len(self.problems)))
            random.Random(f"{self.seed}:{epoch}").shuffle(self._order)
            self._epoch = epoch
        return self.problems[self._order[pos]]

    def next(self, n: int) -> list[Problem]:
        """The next `n` problems of the order (the colocated loop's draws)."""
        out = [self.at(self.drawn + i) for i in range(n)]
        self.drawn += n
        return out

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state["drawn"])
