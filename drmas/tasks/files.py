"""Math problems loaded from local files: GSM8K, MATH / MATH500 and AIME-style jsonl or parquet.

No data hub is reachable from the training machines, so real benchmarks arrive as files the user
supplies. The common public layouts are recognised row by row from their keys, so one file may even mix
them:

- GSM8K: ``question`` + ``answer`` whose final answer follows ``####`` (the worked solution precedes it).
- MATH / MATH500: ``problem`` + ``solution`` containing ``\\boxed{}``, and/or a clean ``answer`` field
  (preferred when present, since it needs no extraction).
- AIME-style: ``problem`` or ``question`` + ``answer``, where the answer may be a JSON number.

A question must be a string and an answer a string or a number; any other value (a list, an object, a
boolean) is refused with its field and type, rather than turned into text such as "['x']" and trained on.

A data error found mid-training would waste the run, so every file is read when the task is built and
every bad row fails with its file and line (jsonl, 1-based) or row index (parquet, 0-based).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

from drmas.config.tasks import MathFileSettings
from drmas.core.errors import naming_key
from drmas.core.jsonl import input_file, jsonl_records
from drmas.tasks import TASKS
from drmas.tasks.base import Problem
from drmas.tasks.grading import extract_boxed, grade_answer

QUESTION_KEYS = ("problem", "question")
GSM8K_MARKER = "####"
SUPPORTED_SUFFIXES = (".jsonl", ".parquet")


@dataclass(frozen=True)
class Row:
    """One raw record and where it came from, so any error about it can point at the exact place."""

    where: str  # "path:LINE" for jsonl, "path:row N" for parquet
    data: dict[str, Any]


def read_rows(path: Path) -> list[Row]:
    """All records of a .jsonl or .parquet file; errors name the file (and line) at fault."""
    input_file(path, "task file")
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = [Row(where, record) for where, _, record in jsonl_records(path)]
    elif suffix == ".parquet":
        rows = list(_parquet_rows(path))
    else:
        expected = ", ".join(SUPPORTED_SUFFIXES)
        raise ValueError(f"{path}: unsupported file type {suffix!r}; expected one of {expected}")
    if not rows:
        raise ValueError(f"{path}: the file holds no problems")
    return rows


def _parquet_rows(path: Path) -> Iterator[Row]:
    """Records of a parquet file (pyarrow is imported only when a parquet file is actually used)."""
    try:
        import pyarrow.parquet as pq
    except ImportError as error:
        raise ImportError(f"{path}: reading parquet files needs pyarrow (pip install pyarrow)") from error
    try:
        records = pq.read_table(path).to_pylist()
    except Exception as error:  # noqa: BLE001 - pyarrow raises several unrelated types for a bad file
        raise ValueError(f"{path}: not a readable parquet file: {error}") from error
    for index, record in enumerate(records):
        yield Row(f"{path}:row {index}", record)


def _present(row: Row, key: str) -> bool:
    """A field counts as present when it is there and not null or blank."""
    value = row.data.get(key)
    return value is not None and not (isinstance(value, str) and not value.strip())


def _keys_found(row: Row) -> str:
    """The keys that hold a value (parquet gives every row every column, nulls included), for error text."""
    return ", ".join(repr(key) for key in row.data if _present(row, key)) or "none"


def _json_type(value: Any) -> str:
    """The JSON name of a value's type (what the user sees in the file), for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):  # numpy arrays from pandas-made parquet
        return "list"
    return type(value).__name__


def _wrong_type(row: Row, key: str, value: Any, expected: str) -> ValueError:
    """The error for a field of the wrong type: file and line/row, field, the type found and what is expected.

    Without it, ``str()`` would quietly turn a list into the question "['x']" and training would go on.
    """
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    kind = _json_type(value)
    article = "an" if kind[0] in "aeiou" else "a"
    return ValueError(f"{row.where}: {key!r} should be {expected}, got {article} {kind} ({shown})")


def row_question(row: Row) -> str:
    """The problem statement: `problem` (MATH, AIME) or `question` (GSM8K); it must be a non-empty string."""
    for key in QUESTION_KEYS:
        if _present(row, key):
            value = row.data[key]
            if not isinstance(value, str):
                raise _wrong_type(row, key, value, "a non-empty string")
            return value.strip()
    raise ValueError(
        f"{row.where}: no question field (expected 'problem' or 'question'); keys found: {_keys_found(row)}"
    )


def _scalar_answer(row: Row, key: str, value: Any) -> str:
    """A JSON/parquet answer value as text: strings as they are, numbers converted (AIME answers are JSON
    numbers; integral floats lose the '.0'); anything else (list, object, boolean, NaN) is refused."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _wrong_type(row, key, value, "a string or a finite number")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def row_answer(row: Row) -> tuple[str, str]:
    """The gold final answer and the name of the layout it was read from."""
    if _present(row, "answer"):
        value = row.data["answer"]
        if isinstance(value, str) and GSM8K_MARKER in value:
            return value.rsplit(GSM8K_MARKER, 1)[1].strip(), "gsm8k"
        if isinstance(value, str) and (boxed := extract_boxed(value)) is not None:
            return boxed, "answer"
        return _scalar_answer(row, "answer", value), "answer"
    if _present(row, "solution"):
        solution = row.data["solution"]
        if not isinstance(solution, str):
            raise _wrong_type(row, "solution", solution, "a string with a \\boxed{} answer")
        boxed = extract_boxed(solution)
        if boxed is None:
            raise ValueError(f"{row.where}: 'solution' has no \\boxed{{}} answer and there is no 'answer' field")
        return boxed, "math"
    raise ValueError(
        f"{row.where}: no answer field (expected 'answer', or 'solution' with \\boxed{{}}); "
        f"keys found: {_keys_found(row)}"
    )


def row_problem(row: Row, split: str, index: int) -> Problem:
    """A Problem from one record; meta says where it came from for tracing odd rewards back to the data."""
    question = row_question(row)
    answer, layout = row_answer(row)
    if not answer:
        raise ValueError(f"{row.where}: the answer is empty")
    return Problem(
        uid=f"file-{split}-{index:06d}",
        question=question,
        answer=answer,
        meta={"source": row.where, "layout": layout},
    )


def load_problems(path: str | Path, split: str) -> list[Problem]:
    """Every problem of one file, with uids numbered within `split`."""
    return [row_problem(row, split, index) for index, row in enumerate(read_rows(Path(path)))]


def load_split_files(
    files: dict[str, Optional[str]], load: Callable[[str, str], list[Problem]]
) -> dict[str, list[Problem]]:
    """`load(path, split)` for every split with a file; an error names its key (`task.train_file: ...`) before
    the file and line it found, so a user knows which setting to fix as well as where the data is wrong."""
    splits = {}
    for split, path in files.items():
        if not path:
            continue
        try:
            splits[split] = load(path, split)
        except (FileNotFoundError, ValueError) as exc:
            raise naming_key(f"task.{split}_file", exc) from exc
    return splits


def load_benchmark_file(path: str | Path) -> list[Problem]:
    """Every problem of a math benchmark file (`drmas eval`); uids `file-bench-<row>` are unique within it."""
    return load_problems(path, "bench")


class MathFileTask:
    """Math problems from user-supplied train/test files, graded by the final answer (task.answer_extraction)."""

    name = "math_file"

    def __init__(self, cfg: MathFileSettings) -> None:
        self._extraction = cfg.answer_extraction
        self._files: dict[str, Optional[str]] = {"train": cfg.train_file, "test": cfg.test_file}
        if not any(self._files.values()):
            raise ValueError("math_file task: set task.train_file and/or task.test_file")
        self._splits = load_split_files(self._files, load_problems)

    def split(self, name: str) -> Sequence[Problem]:
        """The problems of split `name`; a split without a configured file is an error, not an empty list."""
        if name not in self._files:
            raise ValueError(f"math_file task has no split {name!r}; known: {', '.join(self._files)}")
        if name not in self._splits:
            raise ValueError(f"math_file task: split {name!r} needs a file; set task.{name}_file")
        return self._splits[name]

    def load_benchmark(self, path: str | Path) -> list[Problem]:
        """Problems of an extra benchmark file in the same formats (`drmas eval`, eval.benchmarks)."""
        return load_benchmark_file(path)

    def grade(self, problem: Problem, response: str) -> float:
        """1.0 when the response's final answer (last box; see grade_answer) equals the problem's gold answer."""
        return grade_answer(response, problem.answer, self._extraction)


@TASKS.register("math_file", settings=MathFileSettings)
def make_math_file_task(cfg: MathFileSettings) -> MathFileTask:
    """Registry factory: the file-backed math task described by `cfg`."""
    return MathFileTask(cfg)
