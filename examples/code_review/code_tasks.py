"""The `code_tasks` task: short Python functions to write, each with hidden reference tests, a reference solution
and a deliberately wrong one (a plugin; imports `drmas.api` only).

A task file is JSON lines, one task each (tasks.jsonl beside this module, written by make_tasks.py):

    {"id": "add", "split": "train", "entry_point": "add",
     "prompt": "def add(a: int, b: int) -> int:\\n    \\"\\"\\"Return the sum of a and b. ...\\"\\"\\"\\n",
     "reference": "def add(a: int, b: int) -> int:\\n    return a + b\\n",
     "wrong": "def add(a: int, b: int) -> int:\\n    return a - b\\n",
     "tests": ["assert add(1, 2) == 3", ...]}

A `Problem` carries the prompt as its question and the rest in `meta` (entry_point, reference, wrong, tests); its
`answer` is the reference. Grading runs code, so it is done by the system that owns a sandbox (the code_review
system batches it with its other checks); this task's `grade` says so rather than running code itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from drmas.api import TASKS, Problem, TaskSettings, help_field, jsonl_records

SHIPPED = Path(__file__).resolve().with_name("tasks.jsonl")
SPLITS = ("train", "test")
_TEXT_KEYS = ("id", "entry_point", "prompt", "reference", "wrong")


@dataclass
class CodeTaskSettings(TaskSettings):
    name: str = TaskSettings.name_field("code_tasks")
    path: Optional[str] = help_field(
        None, "Task file (JSON lines: id, split train|test, entry_point, prompt, reference, wrong, tests; see "
        "examples/code_review/README.md); a relative path is taken from the working directory. null: the 46 "
        "tasks shipped beside the plugin (examples/code_review/tasks.jsonl, 9 held out).")
    max_tests: int = help_field(0, "Hidden tests used per task (the first N of its `tests`; 0: all).")

    def problems(self, where: str) -> list[str]:
        found = self.at_least(where, max_tests=0)
        if self.path is not None and not Path(self.path).is_file():
            found.append(f"{where}.path: no such file: {self.path}")
        return found


def read_tasks(path: Path, max_tests: int = 0) -> list[tuple[str, Problem]]:
    """(split, Problem) of every line of `path`; ValueError naming the file and the line of a bad task."""
    found, seen = [], set()
    for at, _, record in jsonl_records(path):
        missing = [key for key in (*_TEXT_KEYS, "tests") if key not in record]
        if missing:
            raise ValueError(f"{at}: missing {', '.join(missing)}")
        bad = [key for key in _TEXT_KEYS if not isinstance(record[key], str) or not record[key].strip()]
        if bad:
            raise ValueError(f"{at}: {', '.join(bad)} must be non-empty strings")
        tests = record["tests"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
            raise ValueError(f"{at}: tests must be a non-empty list of statements (strings)")
        split = record.get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"{at}: split must be one of {', '.join(SPLITS)}, got {split!r}")
        if record["id"] in seen:
            raise ValueError(f"{at}: id {record['id']!r} appears twice")
        seen.add(record["id"])
        meta = {"entry_point": record["entry_point"], "reference": record["reference"], "wrong": record["wrong"],
                "tests": tuple(tests[:max_tests] if max_tests else tests)}
        found.append((split, Problem(f"code-{record['id']}", record["prompt"], record["reference"], meta)))
    if not found:
        raise ValueError(f"{path} holds no task")
    return found


class CodeTasks:
    name = "code_tasks"

    def __init__(self, settings: CodeTaskSettings) -> None:
        self.settings = settings
        self.path = Path(settings.path) if settings.path is not None else SHIPPED
        try:
            tasks = read_tasks(self.path, settings.max_tests)
        except (OSError, ValueError) as exc:
            raise ValueError(f"task.path: {exc}") from None
        self._splits = {split: [p for s, p in tasks if s == split] for split in SPLITS}

    def split(self, name: str) -> Sequence[Problem]:
        return self._splits[name]

    def load_benchmark(self, path: str) -> list[Problem]:
        """`eval.benchmarks` files in the same format (every task of the file, whatever its split)."""
        return [problem for _, problem in read_tasks(Path(path), self.settings.max_tests)]

    def grade(self, problem: Problem, response: str) -> float:
        raise NotImplementedError(
            "code_tasks are graded by running the hidden tests in a sandbox: use a system that owns one (code_review "
            "runs problem.meta['tests'] against the solution with its AssertService)")


@TASKS.register("code_tasks", settings=CodeTaskSettings)
def make_code_tasks(settings: CodeTaskSettings) -> CodeTasks:
    return CodeTasks(settings)
