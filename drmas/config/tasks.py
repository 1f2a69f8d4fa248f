"""The settings of the built-in tasks (`task.*` when `task.name` is arithmetic, math_file, multihop, qa_file).

Each is the `settings` its task registers with (`drmas.tasks.*`); they live here, with the other sections,
so any process reads a built-in config without importing the tasks (see `drmas.config.sections`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from drmas.config.fields import help_field as _f
from drmas.config.sections import TASK_SETTINGS, TaskSettings

ANSWER_EXTRACTIONS = ("boxed", "flexible")
OPERATIONS = "+-*"  # what the arithmetic task's stories can do
MIN_ENTITIES = 8  # enough people for distinct mayors, founders, mentors and a spouse or sibling pair

_EXTRACTION_HELP = "How the final answer is read: 'boxed' (only \\boxed{}) or 'flexible' (else the last number)."


@dataclass
class _Generated(TaskSettings):
    """What the generated tasks share: a seed and the sizes of both splits."""

    seed: int = _f(0, "Seed of the generated task (same seed -> same problems).")
    n_train: int = _f(2000, "Number of training problems.")
    n_test: int = _f(200, "Number of held-out problems (disjoint from train).")

    def problems(self, where: str) -> list[str]:
        return self.at_least(where, n_train=0, n_test=0)


@dataclass
class ArithmeticSettings(_Generated):
    """Generated arithmetic word problems."""

    name: str = TaskSettings.name_field("arithmetic")
    min_operands: int = _f(2, "Fewest numbers in a problem.")
    max_operands: int = _f(2, "Most numbers in a problem.")
    max_value: int = _f(20, "Numbers are drawn from 1..max_value.")
    operations: str = _f("+-", "Operations used, a subset of '+-*'.")
    answer_extraction: str = _f("boxed", _EXTRACTION_HELP)

    def problems(self, where: str) -> list[str]:
        found = super().problems(where) + self.at_least(where, min_operands=2, max_value=1)
        if self.max_operands < self.min_operands:
            found.append(f"{where}.max_operands: must be >= {where}.min_operands ({self.min_operands}), "
                         f"got {self.max_operands}")
        unknown = sorted(set(self.operations) - set(OPERATIONS))
        if not self.operations or unknown:
            found.append(f"{where}.operations: must be a non-empty subset of {OPERATIONS!r}, got {self.operations!r}")
        return found + self.one_of(where, "answer_extraction", ANSWER_EXTRACTIONS)


@dataclass
class MathFileSettings(TaskSettings):
    """Math problems from jsonl/parquet files (GSM8K, MATH, AIME layouts)."""

    name: str = TaskSettings.name_field("math_file")
    train_file: Optional[str] = _f(None, "Training problems (.jsonl or .parquet; GSM8K/MATH/AIME style).")
    test_file: Optional[str] = _f(None, "Held-out problems (.jsonl or .parquet).")
    answer_extraction: str = _f("boxed", _EXTRACTION_HELP)

    def problems(self, where: str) -> list[str]:
        return _needs_a_file(self, where) + self.one_of(where, "answer_extraction", ANSWER_EXTRACTIONS)


@dataclass
class MultihopSettings(_Generated):
    """The generated multi-hop QA world and its passage corpus."""

    name: str = TaskSettings.name_field("multihop")
    n_entities: int = _f(120, "Fictional people in the generated world (each with a few relations).")
    two_hop_share: float = _f(0.5, "Share of 2-hop questions (the rest are 1-hop).")

    def problems(self, where: str) -> list[str]:
        found = super().problems(where) + self.at_least(where, n_entities=MIN_ENTITIES)
        if not 0.0 <= self.two_hop_share <= 1.0:
            found.append(f"{where}.two_hop_share: must be in [0, 1], got {self.two_hop_share}")
        return found


@dataclass
class QAFileSettings(TaskSettings):
    """QA questions from Search-R1-layout jsonl/parquet files."""

    name: str = TaskSettings.name_field("qa_file")
    train_file: Optional[str] = _f(None, "Training questions (.jsonl or .parquet, Search-R1 layout).")
    test_file: Optional[str] = _f(None, "Held-out questions (.jsonl or .parquet).")

    def problems(self, where: str) -> list[str]:
        return _needs_a_file(self, where)


def _needs_a_file(settings: TaskSettings, where: str) -> list[str]:
    if settings.train_file or settings.test_file:  # type: ignore[attr-defined]
        return []
    return [f"{where}.train_file: the {settings.name} task needs {where}.train_file and/or {where}.test_file"]


for _name, _cls in (("arithmetic", ArithmeticSettings), ("math_file", MathFileSettings),
                    ("multihop", MultihopSettings), ("qa_file", QAFileSettings)):
    TASK_SETTINGS.adopt(_name, _cls)
