"""avg@k and pass@k from an outcome table: one row per question, one reward per sample.

Definitions used throughout drmas (every row holds the task rewards of k samples of one question):

- **success**: a sample whose reward is an exact match, i.e. ``reward >= 1 - 1e-9`` (the tolerance only
  absorbs float noise; a partial-credit reward such as a token F1 of 0.8 is *not* a success).
- **avg@k**: the mean over questions of the mean reward of their k samples. With 0/1 rewards (math, exact
  match) this is the mean success rate; with partial-credit rewards it is the mean reward (e.g. mean F1).
- **pass@k**: the share of questions with at least one success among their k samples.
- **unbiased pass@k** (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n >= k
  samples of which c succeed, ``1 - C(n-c, k) / C(n, k)`` is the probability that k samples drawn without
  replacement contain a success. It is computed as ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which never forms
  the huge binomials. With n == k it equals the plain pass@k.

Tables may be a list of rows or a mapping question id -> row; errors name the offending question.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence, Union

import numpy as np

SUCCESS_TOLERANCE = 1e-9

OutcomeTable = Union[Sequence[Sequence[float]], Mapping[str, Sequence[float]]]


def outcome_matrix(table: OutcomeTable) -> np.ndarray:
    """The table as a (questions, samples) float array; ValueError for an empty or ragged table or a
    reward outside [0, 1] (NaN included), naming the question (its id, or its row index) and sample."""
    if isinstance(table, Mapping):
        names = [str(key) for key in table]
        rows = list(table.values())
    else:
        rows = list(table)
        names = [f"#{index}" for index in range(len(rows))]
    if not rows:
        raise ValueError("outcome table: no questions")
    width = len(rows[0])
    if width == 0:
        raise ValueError(f"outcome table: question {names[0]} has no samples")
    for name, row in zip(names, rows):
        if len(row) != width:
            raise ValueError(
                f"outcome table is ragged: question {name} has {len(row)} samples, question {names[0]} has {width}"
            )
    matrix = np.asarray(rows, dtype=np.float64)
    bad = ~((matrix >= 0.0) & (matrix <= 1.0))  # also catches NaN
    if bad.any():
        q, s = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"outcome table: question {names[q]} sample {s} has reward {float(matrix[q, s])}, not in [0, 1]")
    return matrix


def successes(table: OutcomeTable) -> np.ndarray:
    """Boolean (questions, samples) array: which samples are exact matches (reward >= 1 - 1e-9)."""
    return outcome_matrix(table) >= 1.0 - SUCCESS_TOLERANCE


def avg_at_k(table: OutcomeTable) -> float:
    """Mean over questions of the mean reward of their samples (= mean success rate for 0/1 rewards)."""
    return float(outcome_matrix(table).mean(axis=1).mean())


def pass_at_k(table: OutcomeTable) -> float:
    """Share of questions with at least one exact-match sample among all the samples of their row."""
    return float(successes(table).any(axis=1).mean())


def unbiased_pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that k of n samples, c of them successes, drawn without replacement hold a success."""
    if k < 1:
        raise ValueError(f"pass@k: k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"pass@k: k = {k} exceeds the n = {n} samples per question")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k: the success count c = {c} must be in [0, n = {n}]")
    if n - c < k:  # every k-subset contains a success
        return 1.0
    failures_only = math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))
    return 1.0 - failures_only


def estimated_pass_at_k(table: OutcomeTable, k: int) -> float:
    """Mean over questions of the unbiased pass@k estimate from each row's n >= k samples."""
    hits = successes(table)
    n = hits.shape[1]
    return float(np.mean([unbiased_pass_at_k(n, int(row.sum()), k) for row in hits]))


def score_table(table: OutcomeTable) -> dict[str, float | int]:
    """The benchmark entry of eval.json: avg@k, pass@k, k (samples per question) and n_questions."""
    matrix = outcome_matrix(table)
    return {
        "avg@k": avg_at_k(matrix),
        "pass@k": pass_at_k(matrix),
        "k": int(matrix.shape[1]),
        "n_questions": int(matrix.shape[0]),
    }
