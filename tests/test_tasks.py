"""Tasks: the registry, the generated arithmetic task and the file-backed math task."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas.config.tasks import ArithmeticSettings, MathFileSettings
from drmas.tasks import TASKS, build_task
from drmas.tasks.arithmetic import ArithmeticTask
from drmas.tasks.base import Problem
from drmas.tasks.files import MathFileTask

ROOT = Path(__file__).resolve().parents[1]

SMALL = ArithmeticSettings(seed=3, n_train=300, n_test=40, min_operands=2, max_operands=4,
                   max_value=12, operations="+-*")


def _skeleton(problem: Problem) -> tuple:
    return tuple(problem.meta["operands"]), tuple(problem.meta["ops"])


def _fingerprint(task: ArithmeticTask) -> list[tuple[str, str, str]]:
    return [(p.uid, p.question, p.answer) for name in ("train", "test") for p in task.split(name)]


# --- registry ---------------------------------------------------------------------------------------


def test_builtin_tasks_are_registered() -> None:
    assert {"arithmetic", "math_file"} <= set(TASKS.names())
    assert isinstance(build_task(SMALL), ArithmeticTask)


def test_unknown_task_name_suggests_the_close_one() -> None:
    with pytest.raises(KeyError, match="arithmetic"):
        build_task(replace(SMALL, name="arithmetc"))


# --- arithmetic -------------------------------------------------------------------------------------


def test_default_config_builds() -> None:
    task = build_task(ArithmeticSettings())
    assert len(task.split("train")) == ArithmeticSettings().n_train
    assert len(task.split("test")) == ArithmeticSettings().n_test


def test_same_seed_same_problems_and_different_seed_different() -> None:
    assert _fingerprint(build_task(SMALL)) == _fingerprint(build_task(SMALL))
    assert _fingerprint(build_task(SMALL)) != _fingerprint(build_task(replace(SMALL, seed=4)))


def test_test_split_does_not_depend_on_n_train() -> None:
    base = build_task(SMALL).split("test")
    more_train = build_task(replace(SMALL, n_train=SMALL.n_train * 2)).split("test")
    assert [(p.question, p.answer) for p in base] == [(p.question, p.answer) for p in more_train]


def test_splits_are_disjoint_and_sized() -> None:
    task = build_task(SMALL)
    train, test = task.split("train"), task.split("test")
    assert (len(train), len(test)) == (SMALL.n_train, SMALL.n_test)
    assert len({p.question for p in train}) == len(train)
    assert len({p.question for p in test}) == len(test)
    assert not {p.question for p in train} & {p.question for p in test}
    # Stronger than text: a test problem's arithmetic never appears in training under other wording.
    assert not {_skeleton(p) for p in train} & {_skeleton(p) for p in test}
    assert train[123].uid == "arith-train-000123"
    assert [p.uid for p in test] == [f"arith-test-{i:06d}" for i in range(len(test))]


def _story_answer(operands: list[int], ops: list[str]) -> tuple[int, int]:
    """Independent recomputation: (final count, lowest intermediate count), steps in reading order."""
    steps: dict[str, Callable[[int, int], int]] = {
        "+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
    }
    total = lowest = operands[0]
    for op, value in zip(ops, operands[1:]):
        total = steps[op](total, value)
        lowest = min(lowest, total)
    return total, lowest


def test_answers_follow_the_stored_arithmetic_and_knobs() -> None:
    task = build_task(SMALL)
    for problem in [*task.split("train"), *task.split("test")]:
        operands, ops = problem.meta["operands"], problem.meta["ops"]
        answer, lowest = _story_answer(operands, ops)
        assert problem.answer == str(answer)
        assert lowest >= 0
        assert SMALL.min_operands <= len(operands) <= SMALL.max_operands
        assert len(ops) == len(operands) - 1
        assert all(1 <= v <= SMALL.max_value for v in operands)
        assert set(ops) <= set(SMALL.operations)
        assert all(str(v) in problem.question for v in operands)
        assert problem.question.endswith("?")


def test_operations_knob_restricts_operations() -> None:
    task = build_task(replace(SMALL, operations="*", n_train=50, n_test=10))
    assert {op for p in task.split("train") for op in p.meta["ops"]} == {"*"}


def test_too_small_space_names_the_knobs() -> None:
    with pytest.raises(ValueError, match="too small.*task.max_value"):
        build_task(replace(SMALL, max_value=2, max_operands=2, operations="+", n_test=10))
    # one skeleton, held out by the test split: nothing is left for training
    with pytest.raises(ValueError, match="too small for task.n_train"):
        build_task(replace(SMALL, max_value=1, max_operands=2, operations="+", n_test=1, n_train=5))


@pytest.mark.parametrize(
    ("change", "knob"),
    [
        ({"operations": "+/"}, "task.operations"),
        ({"operations": ""}, "task.operations"),
        ({"min_operands": 1}, "task.min_operands"),
        ({"min_operands": 3, "max_operands": 2}, "task.max_operands"),
        ({"max_value": 0}, "task.max_value"),
        ({"n_train": -1}, "task.n_train"),
    ],
)
def test_invalid_knobs_are_rejected(change: dict[str, Any], knob: str) -> None:
    with pytest.raises(ValueError, match=knob.replace(".", r"\.")):
        build_task(replace(SMALL, **change))


def test_arithmetic_grading_and_unknown_split() -> None:
    task = build_task(SMALL)
    problem = task.split("test")[0]
    assert task.grade(problem, f"Counting up: \\boxed{{{problem.answer}}}") == 1.0
    assert task.grade(problem, f"\\boxed{{{int(problem.answer) + 1}}}") == 0.0
    assert task.grade(problem, problem.answer) == 0.0  # no box, no reward
    with pytest.raises(ValueError, match="validation"):
        task.split("validation")


# --- math_file: fixtures ----------------------------------------------------------------------------

GSM8K_ROWS = [
    {"question": "Tom has 600 pens and buys 400 more. How many?", "answer": "600 + 400 = 1000\n#### 1,000"},
    {"question": "What is 2 - 5?", "answer": "2 - 5 = -3 #### -3"},
]
MATH_ROWS = [
    {"problem": "Simplify $\\frac{2}{4}$.", "solution": "Divide: $\\boxed{\\frac{1}{2}}$."},
    {"problem": "MATH500 style", "solution": "so \\boxed{\\sqrt{2}}", "answer": "\\sqrt{2}", "unique_id": "x"},
]
AIME_ROWS = [
    {"problem": "Find the remainder.", "answer": 17, "id": "2024-I-1"},
    {"problem": "Find the sum.", "answer": 204, "id": "2024-I-2"},
]
LAYOUTS = {
    "gsm8k": (GSM8K_ROWS, ["1,000", "-3"]),
    "math": (MATH_ROWS, ["\\frac{1}{2}", "\\sqrt{2}"]),
    "aime": (AIME_ROWS, ["17", "204"]),
}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


WRITERS = {".jsonl": write_jsonl, ".parquet": write_parquet}


def file_task(train: Path | None = None, test: Path | None = None) -> MathFileTask:
    cfg = MathFileSettings(train_file=str(train) if train else None,
                     test_file=str(test) if test else None)
    task = build_task(cfg)
    assert isinstance(task, MathFileTask)
    return task


# --- math_file: layouts -----------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", sorted(WRITERS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_load_from_jsonl_and_parquet(tmp_path: Path, layout: str, suffix: str) -> None:
    rows, answers = LAYOUTS[layout]
    path = WRITERS[suffix](tmp_path / f"{layout}{suffix}", rows)
    task = file_task(train=path, test=path)
    problems = task.split("train")
    assert [p.answer for p in problems] == answers
    assert [p.question for p in problems] == [row.get("problem", row.get("question")) for row in rows]
    assert [p.uid for p in problems] == ["file-train-000000", "file-train-000001"]
    assert [p.uid for p in task.split("test")] == ["file-test-000000", "file-test-000001"]
    assert str(path) in problems[0].meta["source"]


def test_loaded_problems_are_graded_by_equivalence(tmp_path: Path) -> None:
    task = file_task(train=write_jsonl(tmp_path / "t.jsonl", GSM8K_ROWS + MATH_ROWS))
    gsm, _, math, _ = task.split("train")
    assert task.grade(gsm, "so \\boxed{1000}") == 1.0
    assert task.grade(math, "\\boxed{0.5}") == 1.0
    assert task.grade(math, "\\boxed{0.25}") == 0.0


def test_question_key_with_numeric_answer(tmp_path: Path) -> None:
    rows = [{"question": "Stored as a float.", "answer": 204.0}, {"question": "A fraction.", "answer": 0.25}]
    task = file_task(train=write_jsonl(tmp_path / "q.jsonl", rows))
    assert [p.answer for p in task.split("train")] == ["204", "0.25"]


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "blank.jsonl"
    path.write_text("\n" + json.dumps(AIME_ROWS[0]) + "\n   \n\n" + json.dumps(AIME_ROWS[1]) + "\n\n")
    assert [p.answer for p in file_task(train=path).split("train")] == ["17", "204"]


# --- math_file: errors ------------------------------------------------------------------------------


def test_invalid_json_reports_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(AIME_ROWS[0]) + "\n\n" + '{"problem": "oops", "answer": \n')
    with pytest.raises(ValueError) as error:
        file_task(train=path)
    assert str(path) in str(error.value)
    assert ":3:" in str(error.value)
    assert "invalid JSON" in str(error.value)


def test_non_object_line_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"list\.jsonl:1: expected a JSON object"):
        file_task(train=path)


def test_missing_answer_names_file_line_and_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "keys.jsonl", [AIME_ROWS[0], {"problem": "no answer here", "hint": "x"}])
    with pytest.raises(ValueError) as error:
        file_task(train=path)
    message = str(error.value)
    assert f"{path}:2:" in message
    assert "'problem'" in message and "'hint'" in message


def test_missing_question_names_file_line_and_keys(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "noq.jsonl", [{"prompt": "what?", "answer": 3}])
    with pytest.raises(ValueError, match=r"noq\.jsonl:1: no question field.*'prompt', 'answer'"):
        file_task(train=path)


def test_missing_keys_in_parquet_names_the_row(tmp_path: Path) -> None:
    rows = [{"problem": "a", "answer": "1"}, {"problem": "b", "answer": None}]
    path = write_parquet(tmp_path / "keys.parquet", rows)
    with pytest.raises(ValueError, match=r"keys\.parquet:row 1: no answer field"):
        file_task(train=path)


def test_solution_without_box_is_reported(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "nobox.jsonl", [{"problem": "p", "solution": "the answer is 4"}])
    with pytest.raises(ValueError, match=r"nobox\.jsonl:1: 'solution' has no"):
        file_task(train=path)


def test_missing_file_names_the_key_and_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError, match=r"task.train_file: task file not found: .*nowhere.jsonl"):
        file_task(train=path)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "1+1?"}])
    with pytest.raises(ValueError, match=r"task.test_file: .*bad.jsonl:1"):
        file_task(test=bad)


def test_an_error_of_any_value_error_type_names_the_key() -> None:
    """An error type that needs more than a message (json's, unicode's) still reaches the user with the key,
    not as a TypeError from re-raising it."""
    from drmas.tasks.files import load_split_files

    def undecodable(path: str, split: str) -> list[Problem]:
        raise json.JSONDecodeError("Expecting value", "{", 1)

    with pytest.raises(ValueError, match=r"^task.test_file: Expecting value"):
        load_split_files({"train": None, "test": "t.jsonl"}, undecodable)


def test_drmas_run_refuses_a_bad_task_file_before_starting_any_process(tmp_path: Path, capsys) -> None:
    """The async launcher reads every data file before it starts the buffer, learners and rollouts: a typo in
    a path is one clear line and exit code 2, not a traceback after the held-out evaluation began."""
    import signal

    from drmas.cli import main

    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:  # the launcher installs its stop handlers in this process
        code = main(["run", "--config", str(ROOT / "configs" / "smoke_async.yaml"), "task.name=math_file",
                     f"task.train_file={tmp_path / 'nowhere.jsonl'}", f"trainer.output_dir={tmp_path / 'run'}"])
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    out, err = capsys.readouterr()
    assert code == 2
    assert "task.train_file: task file not found:" in err and "nowhere.jsonl" in err
    assert "Traceback" not in out + err and "started" not in out and "held-out" not in out


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_empty_file_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"empty\.jsonl: the file holds no problems"):
        file_task(train=path)


def test_unreadable_parquet_and_unknown_suffix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"bad\.parquet: not a readable parquet file"):
        file_task(train=bad)
    csv = tmp_path / "data.csv"
    csv.write_text("question,answer\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        file_task(train=csv)


def test_unconfigured_split_names_the_knob(tmp_path: Path) -> None:
    task = file_task(train=write_jsonl(tmp_path / "train.jsonl", AIME_ROWS))
    with pytest.raises(ValueError, match=r"task\.test_file"):
        task.split("test")
    with pytest.raises(ValueError, match="math_file task: set task.train_file"):
        file_task()


@pytest.mark.parametrize("suffix", sorted(WRITERS))
@pytest.mark.parametrize("row, field, found", [
    ({"question": ["What is 1 + 1?"], "answer": "2"}, "question", "a list"),
    ({"problem": {"text": "What is 1 + 1?"}, "answer": "2"}, "problem", "an object"),
    ({"question": 12, "answer": "2"}, "question", "a number"),
    ({"question": "What is 1 + 1?", "answer": ["2"]}, "answer", "a list"),
    ({"question": "What is 1 + 1?", "answer": {"value": "2"}}, "answer", "an object"),
    ({"question": "What is 1 + 1?", "answer": True}, "answer", "a boolean"),
    ({"question": "What is 1 + 1?", "solution": ["\\boxed{2}"]}, "solution", "a list"),
])
def test_non_text_fields_are_refused_naming_file_place_field_and_type(
        tmp_path: Path, suffix: str, row: dict[str, Any], field: str, found: str) -> None:
    # jsonl: a good line first, so the line number is checked; parquet: one row (a column has one type)
    rows, place = ([AIME_ROWS[0], row], "2") if suffix == ".jsonl" else ([row], "row 0")
    path = WRITERS[suffix](tmp_path / f"typed{suffix}", rows)
    with pytest.raises(ValueError) as error:
        file_task(train=path)
    message = str(error.value)
    assert message.startswith(f"task.train_file: {path}:{place}: {field!r} should be ") and f"got {found} " in message
    assert "['" not in message.split("got")[0]  # the list never became question/answer text


def test_numeric_answers_are_converted_but_not_nan(tmp_path: Path) -> None:
    rows = [{"question": "An int.", "answer": 17}, {"question": "A float.", "answer": 2.5}]
    assert [p.answer for p in file_task(train=write_jsonl(tmp_path / "n.jsonl", rows)).split("train")] == ["17", "2.5"]
    rows = [{"question": "q", "answer": 1.0}, {"question": "r", "answer": float("nan")}]
    path = write_parquet(tmp_path / "nan.parquet", rows)
    with pytest.raises(ValueError, match=r"nan\.parquet:row 1: 'answer' should be a string or a finite number"):
        file_task(train=path)
