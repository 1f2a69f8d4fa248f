"""Hand-computed cases of the staleness rule (AReaL-style bounded version lag)."""

from __future__ import annotations

import pytest

from drmas.core.staleness import admission_capacity, is_too_stale, version_lag


def test_version_lag_counts_updates_since_generation() -> None:
    assert version_lag(3, 3) == 0
    assert version_lag(1, 4) == 3
    assert version_lag(5, 4) == -1  # learner restarted from an older checkpoint: data looks fresh


@pytest.mark.parametrize(
    ("sample_version", "learner_version", "max_staleness", "expected"),
    [
        (0, 0, 0, False),  # on-policy
        (0, 1, 0, True),  # eta=0: version-0 data may only train the update 0 -> 1
        (2, 4, 2, False),  # lag 2 == bound
        (1, 4, 2, True),  # lag 3 > bound
        (5, 4, 0, False),  # negative lag is never stale
    ],
)
def test_is_too_stale(sample_version: int, learner_version: int, max_staleness: int, expected: bool) -> None:
    assert is_too_stale(sample_version, learner_version, max_staleness) is expected


def test_synchronous_admission_allows_exactly_one_step_per_version() -> None:
    # eta=0, 4 groups per step: at version 0 the budget is (0 + 0 + 1) * 4 = 4 groups.
    assert admission_capacity(0, version=0, groups_per_step=4, accepted_groups=0, running_groups=0) == 4
    # all 4 admitted and running -> nothing more until the learner publishes version 1
    assert admission_capacity(0, version=0, groups_per_step=4, accepted_groups=0, running_groups=4) == 0
    # the 4 completed (accepted), still version 0 -> still nothing
    assert admission_capacity(0, version=0, groups_per_step=4, accepted_groups=4, running_groups=0) == 0
    # version 1: (0 + 1 + 1) * 4 - 4 = 4 more
    assert admission_capacity(0, version=1, groups_per_step=4, accepted_groups=4, running_groups=0) == 4


def test_staleness_two_allows_three_steps_ahead() -> None:
    # eta=2, version 0, 3 groups per step: (2 + 0 + 1) * 3 = 9 groups may be outstanding
    assert admission_capacity(2, version=0, groups_per_step=3, accepted_groups=0, running_groups=0) == 9
    # 5 accepted + 2 running -> 9 - 7 = 2
    assert admission_capacity(2, version=0, groups_per_step=3, accepted_groups=5, running_groups=2) == 2
    # version 4: (2 + 4 + 1) * 3 = 21; 14 accepted, 3 running -> 4
    assert admission_capacity(2, version=4, groups_per_step=3, accepted_groups=14, running_groups=3) == 4


def test_max_running_caps_concurrency() -> None:
    # staleness budget 9 - 1 = 8, but only 2 - 1 = 1 more may run concurrently
    assert admission_capacity(2, 0, 3, accepted_groups=0, running_groups=1, max_running=2) == 1
    # the staleness budget is the tighter one: (0 + 0 + 1) * 2 - 2 = 0 < 10 - 0
    assert admission_capacity(0, 0, 2, accepted_groups=2, running_groups=0, max_running=10) == 0


def test_capacity_never_negative() -> None:
    # over-admitted (e.g. a lease expired and its group still arrived): floored at 0
    assert admission_capacity(0, 0, 2, accepted_groups=5, running_groups=1) == 0
    assert admission_capacity(1, 0, 2, accepted_groups=0, running_groups=3, max_running=2) == 0


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        admission_capacity(-1, 0, 1, 0, 0)
    with pytest.raises(ValueError, match="groups_per_step"):
        admission_capacity(0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="max_staleness"):
        is_too_stale(0, 0, -2)
