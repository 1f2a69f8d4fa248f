"""Grading of final math answers: pull the boxed answer out of a response and compare it with the gold.

The episode reward of the math workflows is 1.0 when the solver's final ``\\boxed{}`` answer is
mathematically equal to the gold answer. Equality is decided by ``math_verify`` (symbolic and numeric
comparison) rather than string equality, so a gold of ``12`` also accepts ``12.0``, ``\\frac{24}{2}``
or ``\\text{12}``: formatting does not decide the reward.

Thread safety: math_verify guards parsing and comparison with ``signal.alarm`` timeouts, which raise in
any thread but the main one. Rollout workers grade from worker threads, so outside the main thread the
timeouts are switched off (the library's documented way to run threaded) and a length cap on predicted
answers takes their place as a cheap guard against pathological inputs.
"""

from __future__ import annotations

import logging
import re
import threading

from math_verify import parse, verify

_BOXED = "\\boxed"
# An answer longer than this is not a final answer but runaway generation; refusing it bounds the work
# handed to sympy when no timeout can interrupt it (non-main threads).
MAX_ANSWER_CHARS = 1000
# Seconds math_verify may spend per parse / comparison when a signal-based timeout is usable.
MAIN_THREAD_TIMEOUT_S = 5
# `\boxed 5` style: the token runs to the next whitespace or math delimiter.
_UNBRACED_TOKEN = re.compile(r"[^\s$]+")

_log = logging.getLogger(__name__)


def _matching_brace(text: str, open_pos: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at `open_pos`, or None when the group never closes.

    A backslash escapes the next character so ``\\{`` / ``\\}`` (literal braces, e.g. in sets) do not count.
    """
    depth = 0
    i = open_pos
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _skip_spaces(text: str, pos: int) -> int:
    """First index at or after `pos` that is not whitespace."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def extract_boxed(text: str) -> str | None:
    """Content of the last top-level ``\\boxed{...}`` (or ``\\boxed 5``) in `text`; None when there is none.

    The last box is the model's final answer; earlier boxes are drafts. Braces are balanced, so nested
    groups such as ``\\boxed{\\frac{1}{2}}`` come back whole. If the last box is never closed (the output
    was cut off) the final answer is unknown and None is returned rather than crediting an earlier box.
    An empty box also gives None: it holds no answer.
    """
    answer: str | None = None
    pos = 0
    while (start := text.find(_BOXED, pos)) != -1:
        after = start + len(_BOXED)
        if after < len(text) and text[after].isalpha():
            pos = after  # a different macro that merely starts with \boxed
            continue
        body = _skip_spaces(text, after)
        if body < len(text) and text[body] == "{":
            close = _matching_brace(text, body)
            if close is None:
                return None
            answer, pos = text[body + 1 : close], close + 1
        elif body > after and (token := _UNBRACED_TOKEN.match(text, body)):
            answer, pos = token.group(0), token.end()
        else:
            pos = after
    if answer is None:
        return None
    answer = answer.strip()
    return answer or None


def _timeout_seconds() -> int | None:
    """The math_verify timeout usable from the calling thread: signal alarms only work in the main thread."""
    if threading.current_thread() is threading.main_thread():
        return MAIN_THREAD_TIMEOUT_S
    return None


def _parse_answer(answer: str, timeout: int | None) -> list:
    """math_verify's parse of a bare answer, boxed so LaTeX and plain forms are both recognised.

    Boxing tells math_verify where the answer is: unwrapped, a bare ``\\frac{1}{2}`` or ``\\sqrt{2}`` is
    not found by its extraction patterns.
    """
    return parse(f"{_BOXED}{{{answer}}}", parsing_timeout=timeout)


def _normalised_text(answer: str) -> str:
    """Whitespace-free form of an answer, for the string comparison used when neither side parses."""
    return "".join(answer.split())


def answers_match(pred: str, gold: str) -> bool:
    """True when the predicted answer is mathematically equal to the gold answer.

    Both sides are parsed by math_verify (the gold too: datasets write ``1,000``, ``\\dfrac{1}{2}`` or
    ``0.5`` freely) and compared with `verify`, which is asymmetric, so the gold goes first. Answers that
    neither side can parse fall back to a whitespace-insensitive string comparison. Grading never
    raises: any failure inside the verifier counts as a mismatch, since a crash would lose the episode.
    """
    pred, gold = pred.strip(), gold.strip()
    if not pred or not gold or len(pred) > MAX_ANSWER_CHARS:
        return False
    timeout = _timeout_seconds()
    try:
        gold_parsed = _parse_answer(gold, timeout)
        pred_parsed = _parse_answer(pred, timeout)
        if not gold_parsed or not pred_parsed:
            return _normalised_text(pred) == _normalised_text(gold)
        return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout))
    except Exception:  # noqa: BLE001 - a verifier bug must cost the reward, not the rollout
        _log.debug("answer comparison failed: pred=%r gold=%r", pred, gold, exc_info=True)
        return False


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")

EXTRACTIONS = ("boxed", "flexible")


def extract_last_number(text: str) -> str | None:
    """The last number written in `text` (commas kept for math-verify to read), or None."""
    found = _NUMBER.findall(text)
    return found[-1].rstrip(",") if found else None


def grade_answer(response: str, gold: str, extraction: str = "boxed") -> float:
    """Episode reward of a final response. `boxed` (the method's rule) credits only a \\boxed{} answer;
    `flexible` falls back to the last number in the text when there is no box, like the lenient
    GSM8K extraction, so that a weak model that answers without the format still gets a learning signal."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"unknown answer extraction {extraction!r}; choose one of {', '.join(EXTRACTIONS)}")
    answer = extract_boxed(response)
    if answer is None and extraction == "flexible":
        answer = extract_last_number(response)
    if answer is None:
        return 0.0
    return 1.0 if answers_match(answer, gold) else 0.0


def grade_boxed(response: str, gold: str) -> float:
    """1.0 when `response` has a final boxed answer equal to `gold`, else 0.0 (the math episode reward)."""
    return grade_answer(response, gold, "boxed")
