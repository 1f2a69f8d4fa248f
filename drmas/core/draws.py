"""Draw numbers: where each training prompt stands in the run's one drawing order, and sets of them.

A run draws its training prompts in one order fixed by its seed (`drmas.tasks.sampler.ProblemSampler.at`):
draw 0, 1, 2, ... Every GRPO group is the group of one draw, and the draw number travels with it from the
rollout through the buffer to the learner. That number is what makes a resume lossless: a learner keeps
the draws it has trained (`DrawSet`, saved in its checkpoint), so after any crash the draws that were in
flight -- generated, queued or trained past the last checkpoint -- are exactly the ones no learner holds,
and they are drawn again (`drmas.buffer.draws`).

A `DrawSet` is nearly contiguous (draws are handed out lowest first, and a lost one is drawn again before any
new one), so it is kept as a `floor` (every draw below it is in the set) plus the few draws above it. Pure
data: no sockets, no clocks.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping


class DrawSet:
    """A set of draw numbers (ints >= 0): every draw below `floor`, and `extra` above it."""

    __slots__ = ("floor", "extra")

    def __init__(self, floor: int = 0, extra: Iterable[int] = ()) -> None:
        if floor < 0:
            raise ValueError(f"a draw set's floor must be >= 0, got {floor}")
        self.floor = int(floor)
        self.extra: set[int] = set()
        self.update(extra)

    def add(self, draw: int) -> None:
        if draw < 0:
            raise ValueError(f"draw numbers are >= 0, got {draw}")
        if draw >= self.floor:
            self.extra.add(int(draw))
            self._absorb()

    def update(self, draws: Iterable[int]) -> None:
        for draw in draws:
            self.add(draw)

    def _absorb(self) -> None:
        while self.floor in self.extra:
            self.extra.remove(self.floor)
            self.floor += 1

    def __contains__(self, draw: object) -> bool:
        return isinstance(draw, int) and 0 <= draw and (draw < self.floor or draw in self.extra)

    def __len__(self) -> int:
        return self.floor + len(self.extra)

    def __iter__(self) -> Iterator[int]:
        yield from range(self.floor)
        yield from sorted(self.extra)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DrawSet) and (self.floor, self.extra) == (other.floor, other.extra)

    def __repr__(self) -> str:
        return f"DrawSet(floor={self.floor}, extra={sorted(self.extra)})"

    @property
    def top(self) -> int:
        """One past the highest draw in the set (0 when empty)."""
        return max(self.extra) + 1 if self.extra else self.floor

    def missing_below(self, end: int) -> list[int]:
        """The draws below `end` that are not in the set, in order."""
        return [draw for draw in range(self.floor, end) if draw not in self.extra]

    def copy(self) -> "DrawSet":
        return DrawSet(self.floor, self.extra)

    @staticmethod
    def union(sets: Iterable["DrawSet"]) -> "DrawSet":
        sets = list(sets)
        out = DrawSet(max((s.floor for s in sets), default=0))
        for s in sets:
            out.update(s.extra)
        return out

    def state_dict(self) -> dict:
        """JSON-able form (checkpoints, the wire): {"floor": int, "extra": [sorted ints]}."""
        return {"floor": self.floor, "extra": sorted(self.extra)}

    @classmethod
    def from_state(cls, state: Mapping) -> "DrawSet":
        return cls(int(state.get("floor", 0)), (int(d) for d in state.get("extra", ())))
