"""QA answer grading (normalisation, EM, F1, <answer> extraction) and the Search-R1-layout QA file loaders."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from drmas.config.tasks import QAFileSettings
from drmas.tasks import TASKS, build_task
from drmas.tasks.files import Row
from drmas.tasks.qa_files import QAFileTask, load_qa_problems, make_qa_file_task, row_golden_answers
from drmas.tasks.qa_grading import (
    exact_match,
    extract_answer,
    grade_response,
    normalize_answer,
    score_answer,
    token_f1,
)

FIXTURES = Path(__file__).parent / "fixtures" / "qa"

# --- normalisation, EM, F1 --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("The  Beatles!", "beatles"),
        ("An apple a day", "apple day"),
        ("U.S.A.", "usa"),
        ("Theatre of the Absurd", "theatre of absurd"),  # articles only as whole words
        ("  Jomo\tKenyatta \n", "jomo kenyatta"),
        ("a-ha", "aha"),  # punctuation goes before articles are looked for, as in SQuAD
        ("The", ""),
    ],
)
def test_normalize_answer(text: str, normalised: str) -> None:
    assert normalize_answer(text) == normalised


def test_exact_match_any_gold_after_normalisation() -> None:
    assert exact_match("the Eiffel Tower.", ["Eiffel tower"]) == 1.0
    assert exact_match("Canberra", ["Sydney", "canberra"]) == 1.0
    assert exact_match("Canberra", "Canberra") == 1.0  # a bare string is one gold, not its characters
    assert exact_match("C", "Canberra") == 0.0
    assert exact_match("Sydney, Australia", ["Sydney"]) == 0.0
    assert exact_match("anything", []) == 0.0


@pytest.mark.parametrize(
    ("prediction", "golds", "f1"),
    [
        ("Barack Obama Sr", ["Barack Obama"], 0.8),  # P = 2/3, R = 1
        # vs "obama": P 1/3, R 1 -> 0.5; vs "barack hussein obama": P = R = 2/3 -> 2/3 (the max)
        ("president Barack Obama", ["Obama", "Barack Hussein Obama"], 2 / 3),
        ("the cat cat", ["cat"], 2 / 3),  # repeated tokens count once per gold occurrence: P 1/2, R 1
        ("New Delhi", ["Delhi"], 2 / 3),
        ("Paris", ["London"], 0.0),
        ("", ["Paris"], 0.0),
        ("the", ["a"], 1.0),  # both normalise to nothing: SQuAD scores that as a match
        ("Paris", [], 0.0),
    ],
)
def test_token_f1_hand_computed(prediction: str, golds: list[str], f1: float) -> None:
    assert token_f1(prediction, golds) == pytest.approx(f1)


def test_score_answer_picks_the_metric_and_rejects_unknown_ones() -> None:
    assert score_answer("New Delhi", ["Delhi"], "em") == 0.0
    assert score_answer("New Delhi", ["Delhi"], "f1") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="system.reward_metric"):
        score_answer("x", ["x"], "accuracy")


def test_extract_answer_takes_the_last_tag_and_tolerates_spacing_and_case() -> None:
    assert extract_answer("<answer>Rome</answer> then <answer> Paris </answer>") == "Paris"
    assert extract_answer("I think < Answer >Jomo Kenyatta</ANSWER >.") == "Jomo Kenyatta"
    assert extract_answer("<answer>\nNew\nDelhi\n</answer>") == "New\nDelhi"
    assert extract_answer("<answer></answer>") == ""


def test_extract_answer_is_none_without_a_complete_tag() -> None:
    assert extract_answer("The answer is Paris.") is None
    assert extract_answer("<answer>Paris") is None  # cut off before the closing tag
    assert extract_answer("") is None


def test_grade_response_scores_the_tagged_answer_only() -> None:
    assert grade_response("<think>maybe Rome</think><answer>the Danube</answer>", ["Danube"]) == 1.0
    assert grade_response("Danube", ["Danube"]) == 0.0  # no <answer>: no reward
    assert grade_response("<answer>Blue Danube</answer>", ["Danube"], "f1") == pytest.approx(2 / 3)


# --- the fixture files ------------------------------------------------------------------------------

# file -> (rows, first question, first row's golds, data_source of the rows)
EXPECTED = {
    "nq.jsonl": (4, "who wrote the novel the old man and the sea", ["Ernest Hemingway"], None),
    "triviaqa.jsonl": (3, "Which planet in our solar system is known as the Red Planet?",
                       ["Mars", "Planet Mars", "Mars (planet)", "Fourth planet"], None),
    "popqa.jsonl": (3, "What is George Rankin's occupation?",
                    ["politician", "political leader", "political figure", "polit.", "pol"], None),
    "bamboogle.jsonl": (2, "Who was the first president of the country whose capital is Nairobi?",
                        ["Jomo Kenyatta"], None),
    "hotpotqa.parquet": (3, "Were Scott Derrickson and Ed Wood of the same nationality?", ["yes"], "hotpotqa"),
    "2wikimultihopqa.parquet": (2, "Who is the mother of the director of film Polish-Russian War?",
                                ["Małgorzata Braunek"], "2wikimultihopqa"),
    "musique.parquet": (2, "When was the person who Messi's goals in Copa del Rey compared to get signed by Barcelona?",
                        ["June 1982"], "musique"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_fixture_loads(name: str) -> None:
    n_rows, question, golds, data_source = EXPECTED[name]
    problems = load_qa_problems(FIXTURES / name, "test")
    assert len(problems) == n_rows
    first = problems[0]
    assert first.question == question
    assert first.answer == golds[0]
    assert first.meta["golden_answers"] == golds
    assert first.meta["data_source"] == data_source
    assert first.meta["id"] is not None
    assert [p.uid for p in problems] == [f"qa-test-{i:06d}" for i in range(n_rows)]
    assert all(p.meta["golden_answers"] and p.question for p in problems)


def test_jsonl_rows_keep_their_line_numbers_across_blank_lines() -> None:
    problems = load_qa_problems(FIXTURES / "nq.jsonl", "test")
    assert problems[-1].meta["source"].endswith("nq.jsonl:5")  # line 4 is blank
    assert problems[2].meta["golden_answers"] == ["1969", "20 July 1969", "July 20, 1969"]


def test_answer_field_variants_are_recognised() -> None:
    problems = load_qa_problems(FIXTURES / "variants.jsonl", "train")
    assert [p.meta["golden_answers"] for p in problems] == [
        ["Danube"],  # answer: str
        ["Leonardo da Vinci", "Leonardo"],  # answers: list
        ["Pacific Ocean", "Pacific"],  # golden_answers as a JSON string
        ["Ireland", "Republic of Ireland"],  # PopQA possible_answers (JSON string)
        ["The Merchant of Venice", "Merchant of Venice"],  # TriviaQA answer object, duplicates dropped
        ["1989"],  # a number
    ]
    assert [p.meta["answer_field"] for p in problems] == [
        "answer", "answers", "golden_answers", "possible_answers", "answer", "golden_answers"]


def test_numpy_array_golds_from_pandas_parquet() -> None:
    row = Row("file.parquet:row 0", {"question": "q", "golden_answers": np.array(["Paris", "paris, France"])})
    assert row_golden_answers(row) == (["Paris", "paris, France"], "golden_answers")


def test_reward_model_target_is_the_last_resort(tmp_path: Path) -> None:
    path = tmp_path / "nq_search.parquet"
    rows = [{"question": "who wrote hamlet?", "data_source": "nq",
             "reward_model": {"style": "rule", "ground_truth": {"target": ["William Shakespeare", "Shakespeare"]}}}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    (problem,) = load_qa_problems(path, "train")
    assert problem.meta["golden_answers"] == ["William Shakespeare", "Shakespeare"]
    assert problem.meta["answer_field"] == "reward_model.ground_truth.target"


# --- bad files -------------------------------------------------------------------------------------


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = json.dumps({"question": "q?", "golden_answers": ["a"]})


def test_corrupt_jsonl_line_is_reported_with_file_and_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "nq.jsonl", [GOOD, GOOD, '{"question": "q?", "golden_answers": ["a"'])
    with pytest.raises(ValueError, match=r"nq\.jsonl:3: invalid JSON"):
        load_qa_problems(path, "test")


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ({"golden_answers": ["a"]}, r"no 'question' field; keys found: 'golden_answers'"),
        ({"question": "q?", "id": "x"}, r"no answer field \(expected one of 'golden_answers'"),
        ({"question": "q?", "golden_answers": []}, r"'golden_answers' holds no non-empty answer"),
        ({"question": "q?", "golden_answers": ["", "  "]}, r"'golden_answers' holds no non-empty answer"),
        ({"question": "q?", "golden_answers": '["a", '}, r"'golden_answers' looks like a JSON list but does not parse"),
        ({"question": "q?", "golden_answers": [{"text": "a"}]}, r"'golden_answers' holds a dict"),
        ({"question": 7, "golden_answers": ["a"]}, r"'question' should be a string"),
        ({"question": ["q?"], "golden_answers": ["a"]}, r"'question' should be a string, got list"),
        ({"question": {"text": "q?"}, "golden_answers": ["a"]}, r"'question' should be a string, got dict"),
        ({"question": "q?", "golden_answers": [["a", "b"]]}, r"'golden_answers' holds a list \(\['a', 'b'\]\)"),
        ({"question": "q?", "golden_answers": ["a", None]}, r"'golden_answers' holds a null"),
        ({"question": "q?", "answers": [True]}, r"'answers' holds a bool"),
        ({"question": "q?", "answer": {"value": "Mars", "aliases": "Red Planet"}},
         r"'answer'.aliases should be a list of strings, got a str"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, bad_row: dict, message: str) -> None:
    path = _jsonl(tmp_path / "hotpot.jsonl", [GOOD, json.dumps(bad_row)])
    with pytest.raises(ValueError, match=rf"hotpot\.jsonl:2: {message}"):
        load_qa_problems(path, "test")


def test_a_nan_gold_from_parquet_is_refused_with_its_row(tmp_path: Path) -> None:
    path = tmp_path / "popqa.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q1?", "answer": 1969.0},
                                         {"question": "q2?", "answer": float("nan")}]), path)
    with pytest.raises(ValueError, match=r"popqa\.parquet:row 1: 'answer' holds a float \(nan\)"):
        load_qa_problems(path, "test")


def test_parquet_row_missing_answers_is_reported_with_row_index(tmp_path: Path) -> None:
    path = tmp_path / "musique.parquet"
    rows = [{"question": "q1?", "golden_answers": ["a"]}, {"question": "q2?", "golden_answers": None}]
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"musique\.parquet:row 1: no answer field"):
        load_qa_problems(path, "test")


# --- the qa_file task -------------------------------------------------------------------------------


def test_qa_file_task_is_registered_and_serves_its_splits() -> None:
    assert {"qa_file", "multihop"} <= set(TASKS.names())
    cfg = QAFileSettings(train_file=str(FIXTURES / "hotpotqa.parquet"),
                     test_file=str(FIXTURES / "bamboogle.jsonl"))
    task = build_task(cfg)
    assert isinstance(task, QAFileTask) and task.metric == "em"
    assert len(task.split("train")) == 3 and len(task.split("test")) == 2
    third = task.split("train")[2]
    assert task.grade(third, "<answer>new delhi</answer>") == 1.0  # any alias counts
    assert task.grade(third, "<answer>Mumbai</answer>") == 0.0
    assert task.grade(third, "New Delhi") == 0.0
    bench = task.load_benchmark(FIXTURES / "popqa.jsonl")
    assert [p.uid for p in bench][:1] == ["qa-bench-popqa-000000"]


def test_qa_file_task_f1_metric_and_errors() -> None:
    task = make_qa_file_task(QAFileSettings(test_file=str(FIXTURES / "bamboogle.jsonl")), metric="f1")
    first = task.split("test")[0]
    assert task.grade(first, "<answer>Kenyatta</answer>") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="set task.train_file"):
        task.split("train")
    with pytest.raises(ValueError, match="retrieval.corpus"):
        task.passages()
    with pytest.raises(ValueError, match="set task.train_file and/or task.test_file"):
        QAFileTask(QAFileSettings())
    with pytest.raises(ValueError, match="system.reward_metric"):
        QAFileTask(QAFileSettings(test_file=str(FIXTURES / "nq.jsonl")), metric="rouge")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        QAFileTask(QAFileSettings(test_file=str(FIXTURES / "missing.jsonl")))
