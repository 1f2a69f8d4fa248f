"""The run's one drawing order of training problems: draw number -> problem, deterministic and resumable.

Epoch e visits the train split in a permutation seeded by (seed, e), so draw d is problem
``perm(seed, d // n)[d % n]`` of an n-problem split: a pure function of the seed and the draw number. The
colocated loop draws 0, 1, 2, ... (its whole state is how many it drew); the asynchronous pipeline's buffer
hands out draw numbers and every rollout maps them with `at`, so both modes train on the same prompts in
the same order, and a resumed run continues with exactly the problems it would have seen (see
`drmas.core.draws`).

Why rollouts checkpoint nothing of it: the order is a pure function, and what a run has consumed of it (the
draws trained) lives in the learners' checkpoints. What must not change across a resume is the function
itself, so checkpoints keep its `fingerprint` (seed, problems) and a resume under another one is refused
(`order_change`): the draws its checkpoint holds would name other prompts.
"""

from __future__ import annotations

import hashlib
import random
from typing import Mapping, Optional, Sequence

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

    def fingerprint(self) -> dict:
        """What fixes the order: the seed and the train split (its problems' uids and questions, digested)."""
        digest = hashlib.sha256()
        for problem in self.problems:
            digest.update(f"{problem.uid}\0{problem.question}\0".encode())
        return {"seed": self.seed, "problems": len(self.problems), "digest": digest.hexdigest()[:16]}

    def state_dict(self) -> dict:
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        self.drawn = int(state["drawn"])


def order_change(saved: Optional[Mapping], current: Mapping) -> Optional[str]:
    """Why a checkpoint's drawing order (`saved`, a `fingerprint`; None for a checkpoint older than it) is not
    this run's (`current`), naming the key to restore; None when they agree."""
    if not saved:
        return None
    hint = "resume with the checkpoint's settings, or start a new run (another trainer.output_dir)"
    if saved.get("seed") != current["seed"]:
        return (f"trainer.seed={current['seed']}, but the checkpoint's run drew its prompts with trainer.seed="
                f"{saved.get('seed')}: the draws it trained would name other prompts; {hint}")
    if saved.get("digest") != current["digest"]:
        return (f"the task's training split (the task.* settings or data files) is not the checkpoint's "
                f"({saved.get('problems')} problems then, {current['problems']} now, digests {saved.get('digest')} "
                f"and {current['digest']}): the draws it trained would name other prompts; {hint}")
    return None
