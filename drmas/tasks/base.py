"""Task interface: a source of problems with a held-out split and a grader.

A `Problem` is a task instance (one GRPO group is n episodes of the same problem). `grade` returns the
episode's task reward in [0, 1] for the final answer text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class Problem:
    uid: str  # stable id, unique within the task (used for group ids)
    question: str
    answer: str  # the gold answer (a number or LaTeX expression for math)
    meta: dict = field(default_factory=dict, compare=False, hash=False)


class Task(Protocol):
    """A set of problems split into train and held-out parts, plus how to grade an answer."""

    name: str

    def split(self, name: str) -> Sequence[Problem]:
        """The problems of split `name` ("train" or "test")."""
        ...

    def grade(self, problem: Problem, response: str) -> float:
        """Task reward in [0, 1] of a final response (e.g. 1.0 when its boxed answer equals the gold)."""
        ...
