"""Open-domain QA problems from local files in the Search-R1 / FlashRAG layout (task "qa_file").

The search benchmarks of the paper (NQ, TriviaQA, PopQA, HotpotQA, 2WikiMultihopQA, MuSiQue, Bamboogle)
circulate as FlashRAG jsonl files and as the parquet files Search-R1's preprocessing writes from them.
Both hold one question per row: ``question`` plus ``golden_answers`` (a list of aliases; a numpy array
when the parquet went through pandas), with optional ``id``, ``data_source`` and dataset-specific extras
(``metadata``, ``prompt``, ``reward_model``...) that are kept out of the way. Common variants of the
answer field are accepted too: ``answer`` (a string, or TriviaQA's ``{"value", "aliases"}`` object),
``answers`` (a list), ``possible_answers`` (PopQA's JSON string), ``golden_answers`` given as a JSON
string, and Search-R1's ``reward_model.ground_truth.target`` when nothing else is present.

Files are read with `drmas.tasks.files.read_rows`, so every bad row fails when the task is built with
its file and line (jsonl, 1-based) or row index (parquet, 0-based). The task has no passage corpus of
its own: retrieval.corpus must name one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence

from drmas.config.tasks import QAFileSettings
from drmas.tasks import TASKS
from drmas.tasks.base import Problem
from drmas.tasks.files import Row, load_split_files, read_rows
from drmas.tasks.qa_grading import check_metric, grade_response

# Answer fields in order of preference: the Search-R1/FlashRAG name first, then the raw datasets' names.
ANSWER_KEYS = ("golden_answers", "answers", "answer", "possible_answers")


def _has_value(value: Any) -> bool:
    """Present means not null and not a blank string (parquet gives every row every column)."""
    return value is not None and not (isinstance(value, str) and not value.strip())


def _keys_found(row: Row) -> str:
    """The keys of a row that hold a value, for error messages."""
    return ", ".join(repr(key) for key, value in row.data.items() if _has_value(value)) or "none"


def _type_name(value: Any) -> str:
    """A value's type as the user knows it from the file (null rather than NoneType)."""
    return "null" if value is None else type(value).__name__


def _answer_text(row: Row, key: str, value: Any) -> str:
    """One gold alias as text; integral floats lose their '.0' (years read back from parquet).

    Only strings and finite numbers are answers: a nested list, an object, a boolean or a null inside the
    answer field is refused, since its text ("['a']", "None") would become a gold answer nobody can match.
    """
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"{row.where}: {key!r} holds a {_type_name(value)} ({repr(value)[:60]}) where an answer string was expected"
        )
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _parse_json_list(row: Row, key: str, text: str) -> list[Any]:
    """A field holding a JSON-encoded list of answers ('["Paris", "City of Light"]')."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{row.where}: {key!r} looks like a JSON list but does not parse: {error}") from None
    if not isinstance(parsed, list):
        raise ValueError(f"{row.where}: {key!r} should be a list of answers, got JSON {type(parsed).__name__}")
    return parsed


def _answer_values(row: Row, key: str, value: Any) -> list[Any]:
    """The raw aliases inside an answer field, whichever of the known shapes it has."""
    if isinstance(value, str):
        stripped = value.strip()
        return _parse_json_list(row, key, stripped) if stripped.startswith("[") else [stripped]
    if isinstance(value, dict):  # TriviaQA's {"value": ..., "aliases": [...]}
        if "value" not in value:
            raise ValueError(f"{row.where}: {key!r} is an object without a 'value' (keys: {', '.join(value)})")
        aliases = value.get("aliases") or []
        if hasattr(aliases, "tolist"):
            aliases = aliases.tolist()
        if not isinstance(aliases, (list, tuple)):  # a string here would be split into its characters
            raise ValueError(f"{row.where}: {key!r}.aliases should be a list of strings, got a {_type_name(aliases)}")
        return [value["value"], *aliases]
    if hasattr(value, "tolist"):  # numpy arrays (parquet through pandas) and numpy scalars
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _reward_model_target(row: Row) -> Any:
    """Search-R1's `reward_model.ground_truth.target`, or None when the row has no such nesting."""
    reward_model = row.data.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    return ground_truth.get("target") if isinstance(ground_truth, dict) else None


def row_golden_answers(row: Row) -> tuple[list[str], str]:
    """The distinct, non-empty gold aliases of a row, in file order, and the field they came from."""
    for key in ANSWER_KEYS:
        if _has_value(row.data.get(key)):
            values = _answer_values(row, key, row.data[key])
            break
    else:
        target = _reward_model_target(row)
        if not _has_value(target):
            raise ValueError(
                f"{row.where}: no answer field (expected one of {', '.join(repr(k) for k in ANSWER_KEYS)}); "
                f"keys found: {_keys_found(row)}"
            )
        key = "reward_model.ground_truth.target"
        values = _answer_values(row, key, target)
    golds: list[str] = []
    for value in values:
        text = _answer_text(row, key, value)
        if text and text not in golds:
            golds.append(text)
    if not golds:
        raise ValueError(f"{row.where}: {key!r} holds no non-empty answer")
    return golds, key


def row_question(row: Row) -> str:
    """The question text of a row."""
    value = row.data.get("question")
    if not _has_value(value):
        raise ValueError(f"{row.where}: no 'question' field; keys found: {_keys_found(row)}")
    if not isinstance(value, str):
        raise ValueError(f"{row.where}: 'question' should be a string, got {type(value).__name__}")
    return value.strip()


def _optional_text(value: Any) -> Optional[str]:
    """An optional identifying field (id, data_source) as text, or None."""
    return str(value) if _has_value(value) else None


def row_problem(row: Row, uid: str) -> Problem:
    """A Problem from one row: the first gold is `answer`, every alias is in meta['golden_answers']."""
    question = row_question(row)
    golds, answer_field = row_golden_answers(row)
    return Problem(
        uid=uid,
        question=question,
        answer=golds[0],
        meta={
            "golden_answers": golds,
            "source": row.where,
            "answer_field": answer_field,
            "id": _optional_text(row.data.get("id")),
            "data_source": _optional_text(row.data.get("data_source")),
        },
    )


def load_qa_problems(path: str | Path, prefix: str) -> list[Problem]:
    """Every question of one .jsonl/.parquet file; uids are `qa-<prefix>-<row number>`."""
    return [row_problem(row, f"qa-{prefix}-{index:06d}") for index, row in enumerate(read_rows(Path(path)))]


def load_benchmark_file(path: str | Path) -> list[Problem]:
    """A benchmark file's questions, uids prefixed by the file's stem (kept apart from the task's splits)."""
    return load_qa_problems(path, f"bench-{Path(path).stem}")


class QAFileTask:
    """QA questions from user-supplied Search-R1-layout files, graded by EM or F1 of the final <answer>."""

    name = "qa_file"

    def __init__(self, cfg: QAFileSettings, metric: str = "em") -> None:
        self.metric = check_metric(metric)
        self._files: dict[str, Optional[str]] = {"train": cfg.train_file, "test": cfg.test_file}
        if not any(self._files.values()):
            raise ValueError("qa_file task: set task.train_file and/or task.test_file")
        self._splits = load_split_files(self._files, load_qa_problems)

    def split(self, name: str) -> Sequence[Problem]:
        """The problems of split `name`; a split without a configured file is an error, not an empty list."""
        if name not in self._files:
            raise ValueError(f"qa_file task has no split {name!r}; known: {', '.join(self._files)}")
        if name not in self._splits:
            raise ValueError(f"qa_file task: split {name!r} needs a file; set task.{name}_file")
        return self._splits[name]

    def grade(self, problem: Problem, response: str) -> float:
        """EM (or F1) of the response's last <answer> against every gold alias; 0.0 without an <answer>."""
        return grade_response(response, problem.meta.get("golden_answers") or [problem.answer], self.metric)

    def passages(self) -> list:
        """A qa_file task brings no corpus; the retriever must be given one."""
        raise ValueError(
            "the qa_file task has no passage corpus of its own; set retrieval.corpus to a passages jsonl "
            '({"id": ..., "contents": "title\\ntext"} per line)'
        )

    def load_benchmark(self, path: str | Path) -> list[Problem]:
        """Questions of a benchmark file in the same layout (for `drmas eval`)."""
        return load_benchmark_file(path)


@TASKS.register("qa_file", settings=QAFileSettings)
def make_qa_file_task(cfg: QAFileSettings, metric: str = "em") -> QAFileTask:
    """Registry factory: the file-backed QA task described by `cfg`, graded by `metric` ('em' or 'f1')."""
    return QAFileTask(cfg, metric)
