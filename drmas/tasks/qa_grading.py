"""Grading of short open-domain QA answers: exact match and token F1 after SQuAD-style normalisation.

The search workflows reward the Answer agent's final ``<answer>...</answer>`` against the question's gold
answers, the way Search-R1 and the QA benchmarks it evaluates on (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki,
MuSiQue, Bamboogle) do: both sides are lower-cased, stripped of punctuation and of the articles
a/an/the, and their whitespace collapsed, so "The Beatles." matches "beatles". A question may carry
several gold aliases; a prediction scores its best match over them.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Optional, Sequence, Union

from drmas.config.systems import QA_METRICS

METRICS = QA_METRICS

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# Tolerant of whitespace and case inside the tags: "< Answer >x</ANSWER >".
_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)

Golds = Union[str, Sequence[str]]


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles a/an/the, collapse whitespace (SQuAD order)."""
    lowered = text.lower()
    no_punctuation = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punctuation)
    return " ".join(no_articles.split())


def _gold_list(golds: Golds) -> list[str]:
    """Golds as a list; a bare string is one gold (not a sequence of characters)."""
    return [golds] if isinstance(golds, str) else list(golds)


def exact_match(prediction: str, golds: Golds) -> float:
    """1.0 when the normalised prediction equals any normalised gold, else 0.0."""
    predicted = normalize_answer(prediction)
    return float(any(predicted == normalize_answer(gold) for gold in _gold_list(golds)))


def _f1_one(predicted_tokens: list[str], gold_tokens: list[str]) -> float:
    """Token-overlap F1 of one prediction against one gold (both already normalised and split)."""
    if not predicted_tokens or not gold_tokens:
        # SQuAD convention: an empty side scores 1 only when both are empty.
        return float(predicted_tokens == gold_tokens)
    common = Counter(predicted_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Golds) -> float:
    """Best token-overlap F1 of the normalised prediction over the golds (0.0 when there are none)."""
    predicted_tokens = normalize_answer(prediction).split()
    scores = [_f1_one(predicted_tokens, normalize_answer(gold).split()) for gold in _gold_list(golds)]
    return max(scores, default=0.0)


def extract_answer(text: str) -> Optional[str]:
    """The content of the last ``<answer>...</answer>`` in `text`, stripped; None when there is none.

    An opening tag without its closing tag does not count (the generation was cut off mid-answer).
    """
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def check_metric(metric: str, key: str = "system.reward_metric") -> str:
    """`metric` when it is a known QA metric; ValueError naming the config key otherwise."""
    if metric not in METRICS:
        raise ValueError(f"{key} must be one of {', '.join(METRICS)}; got {metric!r}")
    return metric


def score_answer(prediction: str, golds: Golds, metric: str = "em") -> float:
    """The prediction's score under `metric` ('em' exact match or 'f1' token F1)."""
    if check_metric(metric) == "em":
        return exact_match(prediction, golds)
    return token_f1(prediction, golds)


def grade_response(response: str, golds: Golds, metric: str = "em") -> float:
    """Score of the last <answer> in a response; 0.0 when the response gives no tagged answer."""
    answer = extract_answer(response)
    return 0.0 if answer is None else score_answer(answer, golds, metric)
