"""The stability benchmark's statistics on hand-built groups whose figures are worked out by hand.

The benchmark's conclusions rest on these numbers (E[A^2] per agent over sets with spread, the paper's
formula for it under `global`, the gradient-spike share), so each is pinned to a value computed on paper,
and the formula is checked against the advantages the learner really computes (drmas.algorithms.advantage).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from drmas.algorithms.advantage import compute_advantages

_PATH = Path(__file__).resolve().parents[1] / "bench" / "stability_stats.py"
_SPEC = importlib.util.spec_from_file_location("stability_stats", _PATH)
stats = importlib.util.module_from_spec(_SPEC)
sys.modules["stability_stats"] = stats
_SPEC.loader.exec_module(stats)

# One group of four episodes: t1..t3 solved by the solver at once, t4 failed and went to the reviser, who
# failed too. Trajectory scores 1, 1, 1, 0: mean 0.75, unbiased std 0.5.
REWARDS = [1.0, 1.0, 1.0, 0.0, 0.0]
AGENTS = ["solver", "solver", "solver", "solver", "reviser"]
TRAJS = ["t1", "t2", "t3", "t4", "t4"]
GROUPS = ["g"] * 5


def _figures(mode: str):
    args = (REWARDS, GROUPS, AGENTS, TRAJS)
    adv = compute_advantages(*args, mode=mode)
    view = stats.set_view(mode, *args)
    return stats.measured_second_moment(adv, AGENTS, view), stats.predicted_second_moment(AGENTS, stats.set_view("global", *args))


def test_global_mis_scales_the_agent_called_only_in_the_failed_episode() -> None:
    measured, predicted = _figures("global")
    # reviser: A = (0 - 0.75) / 0.5 = -1.5 -> 2.25; solver: (3 * 0.25 + 2.25) / 4 = 0.75
    assert measured["reviser"]["sq_mean"] == pytest.approx(2.25, rel=1e-5)
    assert measured["solver"]["sq_mean"] == pytest.approx(0.75, rel=1e-5)
    assert predicted["reviser"] == pytest.approx(
        {"predicted": 2.25, "spread_term": 0.0, "offset_term": 2.25, "calls": 1}, rel=1e-9)
    assert predicted["solver"]["predicted"] == pytest.approx(0.75)
    assert predicted["solver"]["spread_term"] == pytest.approx(0.1875 / 0.25)  # population var 3/16 over 1/4
    assert predicted["solver"]["offset_term"] == pytest.approx(0.0)


def test_agent_mode_leaves_out_one_member_sets() -> None:
    measured, _ = _figures("agent")
    assert measured["solver"] == {"sq_mean": pytest.approx(0.75, rel=1e-5), "calls": 4}
    assert math.isnan(measured["reviser"]["sq_mean"]) and measured["reviser"]["calls"] == 0


def test_step_global_pools_every_call() -> None:
    measured, _ = _figures("step_global")
    # values 1, 1, 1, 0, 0: mean 0.6, unbiased variance 0.3
    assert measured["reviser"]["sq_mean"] == pytest.approx(0.36 / 0.3, rel=1e-5)
    assert measured["solver"]["sq_mean"] == pytest.approx((3 * 0.16 + 0.36) / 4 / 0.3, rel=1e-5)


def test_global_values_are_trajectory_scores_and_sets_are_trajectories() -> None:
    view = stats.set_view("global", [0.9, 1.0, 0.0, 0.0], ["g"] * 4, ["solver", "reviser", "solver", "solver"],
                          ["a", "a", "b", "c"])
    assert view.value.tolist() == pytest.approx([0.95, 0.95, 0.0, 0.0])
    assert view.set_size.tolist() == [3, 3, 3, 3]  # three trajectories, not four calls
    assert view.set_mean[0] == pytest.approx(0.95 / 3)


def test_constant_and_singleton_sets_have_no_spread() -> None:
    view = stats.set_view("agent", [-0.1, -0.1, -0.1, 0.7], ["g", "g", "g", "h"], ["s"] * 4, ["a", "b", "c", "d"])
    assert view.set_std[:3].tolist() == [0.0, 0.0, 0.0]  # no 1e-17 left over from a summed mean
    assert not view.spread.any()


@pytest.mark.parametrize("mode", ["global", "step_global", "agent"])
def test_formula_equals_the_learners_advantages_on_random_groups(mode: str) -> None:
    """On any input, the formula per (set, agent) cell reproduces the mean A^2 of the real advantages."""
    rng = np.random.default_rng(0)
    rewards, groups, agents, trajs = [], [], [], []
    for g in range(30):
        for t in range(6):
            for agent in ("solver", "reviser", "reviser")[: rng.integers(1, 4)]:
                rewards.append(float(rng.integers(0, 2)) - 0.1 * float(rng.integers(0, 2)))
                groups.append(f"g{g}"), agents.append(agent), trajs.append(f"t{t}")
    adv = compute_advantages(rewards, groups, agents, trajs, mode=mode, eps=0.0)
    view = stats.set_view(mode, rewards, groups, agents, trajs)
    measured = stats.measured_second_moment(adv, agents, view)
    predicted = stats.predicted_second_moment(agents, view)
    for agent in ("solver", "reviser"):
        assert measured[agent]["calls"] == predicted[agent]["calls"] > 0
        assert measured[agent]["sq_mean"] == pytest.approx(predicted[agent]["predicted"], rel=1e-9)
        assert predicted[agent]["spread_term"] + predicted[agent]["offset_term"] == pytest.approx(
            predicted[agent]["predicted"])
    if mode == "agent":  # each set normalised on its own: only the spread term, (n - 1) / n per set
        assert predicted["solver"]["offset_term"] == pytest.approx(0.0, abs=1e-12)


def test_spike_share_counts_steps_above_three_times_the_running_median() -> None:
    result = stats.spike_share([1.0, 1.0, 1.0, 10.0, 1.0, 2.9, float("nan")])
    # step 4 (10 > 3 x 1) is the only spike among the 5 finite steps after the first
    assert result == {"median": 1.0, "max": 10.0, "spike_share": pytest.approx(1 / 5)}
    assert math.isnan(stats.spike_share([2.0])["spike_share"])


def test_over_seeds_reports_mean_and_sample_spread_and_skips_missing() -> None:
    assert stats.over_seeds([1.0, 2.0, 3.0, float("nan"), None]) == {
        "mean": 2.0, "std": 1.0, "min": 1.0, "max": 3.0, "n": 3}
    assert stats.over_seeds([float("nan")])["n"] == 0
