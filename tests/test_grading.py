"""Boxed-answer extraction and math-equivalence grading, including use from worker threads."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from drmas.tasks.grading import MAX_ANSWER_CHARS, answers_match, extract_boxed, grade_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("nested \\boxed{\\sqrt{\\frac{a}{b}} + {c}}", "\\sqrt{\\frac{a}{b}} + {c}"),
        ("draft \\boxed{3}, corrected: \\boxed{4}", "4"),
        ("unbraced $\\boxed 5$", "5"),
        ("space before brace \\boxed  {7}", "7"),
        ("escaped braces \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("padding \\boxed{  9  }", "9"),
        ("box in a box \\boxed{\\boxed{8}}", "\\boxed{8}"),
    ],
)
def test_extract_boxed_finds_last_balanced_box(text: str, expected: str) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "no box at all: 42",
        "",
        "\\boxed{}",  # an empty box holds no answer
        "\\boxed{3} then cut off \\boxed{4",  # the final answer was truncated: do not credit the draft
        "\\boxedanswer{3}",  # another macro, not \boxed
        "dangling \\boxed",
    ],
)
def test_extract_boxed_returns_none_without_a_final_answer(text: str) -> None:
    assert extract_boxed(text) is None


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("12", "12"),
        ("12", "12.0"),
        ("-3", "-3"),
        ("\\frac{1}{2}", "0.5"),
        ("0.5", "\\frac{1}{2}"),
        ("\\dfrac{3}{4}", "0.75"),
        ("1,000", "1000"),
        ("1000", "1,000"),
        ("\\sqrt{2}", "2^{1/2}"),
        ("x^2 + 1", "1 + x^2"),
        ("\\text{12}", "12"),
    ],
)
def test_answers_match_equivalent_forms(pred: str, gold: str) -> None:
    assert answers_match(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"),
    [("7", "8"), ("-3", "3"), ("\\frac{1}{3}", "0.5"), ("", "1"), ("1", ""), ("x", "y")],
)
def test_answers_match_rejects_different_answers(pred: str, gold: str) -> None:
    assert not answers_match(pred, gold)


def test_overlong_prediction_is_rejected_without_parsing() -> None:
    assert not answers_match("1" * (MAX_ANSWER_CHARS + 1), "1")


def test_grade_boxed() -> None:
    assert grade_boxed("Adding gives \\boxed{1,000}.", "1000") == 1.0
    assert grade_boxed("first \\boxed{5}, then \\boxed{6}", "6") == 1.0
    assert grade_boxed("first \\boxed{6}, then \\boxed{5}", "6") == 0.0
    assert grade_boxed("the answer is 6", "6") == 0.0


def test_grading_works_from_worker_threads() -> None:
    """math_verify's signal-based timeouts raise outside the main thread; rollout workers grade there."""
    cases = [("\\boxed{\\frac{1}{2}}", "0.5", 1.0), ("\\boxed{12.0}", "12", 1.0), ("\\boxed{7}", "8", 0.0)] * 4
    seen_threads: set[int] = set()

    def grade(case: tuple[str, str, float]) -> float:
        seen_threads.add(threading.get_ident())
        return grade_boxed(case[0], case[1])

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(grade, cases))
    assert results == [expected for _, _, expected in cases]
    assert threading.main_thread().ident not in seen_threads
