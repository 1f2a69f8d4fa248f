"""Hand-computed checks of the three advantage modes, their edge cases and the Dr. MAS motivation."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from drmas.algorithms.advantage import compute_advantages
from drmas.algorithms.running_stats import AgentRewardStats

EPS = 1e-6

# One group, two trajectories. Solver is called twice in traj 0 and once in traj 1; verifier once each.
#            traj 0: solver, solver, verifier | traj 1: solver, verifier
REWARDS = [1.0, 0.0, 1.0, 0.5, 0.0]
GROUPS = ["g"] * 5
AGENTS = ["solver", "solver", "verifier", "solver", "verifier"]
TRAJS = [0, 0, 0, 1, 1]


def adv(mode: str, **kw: object) -> np.ndarray:
    return compute_advantages(REWARDS, GROUPS, AGENTS, TRAJS, mode=mode, **kw)


def test_agent_mode_counts_every_call_of_the_agent() -> None:
    # solver {1, 0, 0.5}: mean 0.5, unbiased std sqrt(0.5/2) = 0.5; verifier {1, 0}: mean 0.5, std sqrt(0.5)
    s, v = 0.5 + EPS, math.sqrt(0.5) + EPS
    expected = [0.5 / s, -0.5 / s, 0.5 / v, 0.0, -0.5 / v]
    np.testing.assert_allclose(adv("agent"), expected, rtol=1e-12, atol=1e-12)


def test_global_mode_uses_one_score_per_trajectory() -> None:
    # scores 2/3 and 1/4 -> mean 11/24, std |2/3 - 1/4| / sqrt(2) = 5 / (12 sqrt 2); deviations +-5/24
    std = 5.0 / (12.0 * math.sqrt(2.0))
    a = (5.0 / 24.0) / (std + EPS)
    np.testing.assert_allclose(adv("global"), [a, a, a, -a, -a], rtol=1e-12)
    assert a == pytest.approx(math.sqrt(0.5), rel=1e-5)


def test_step_global_pools_all_calls_of_the_group() -> None:
    # {1, 0, 1, 0.5, 0}: mean 0.5, squared deviations sum 1.0 -> var 0.25, std 0.5
    s = 0.5 + EPS
    np.testing.assert_allclose(adv("step_global"), [0.5 / s, -0.5 / s, 0.5 / s, 0.0, -0.5 / s], rtol=1e-12)


def test_mean_only_skips_std_division() -> None:
    np.testing.assert_allclose(adv("agent", norm_by_std=False), [0.5, -0.5, 0.5, 0.0, -0.5])
    np.testing.assert_allclose(adv("global", norm_by_std=False), [5 / 24] * 3 + [-5 / 24] * 2)
    np.testing.assert_allclose(adv("step_global", norm_by_std=False), [0.5, -0.5, 0.5, 0.0, -0.5])


@pytest.mark.parametrize("mode", ["global", "agent", "step_global"])
def test_equal_rewards_give_exactly_zero(mode: str) -> None:
    out = compute_advantages([0.1] * 5, GROUPS, AGENTS, TRAJS, mode=mode)
    assert out.dtype == np.float64
    assert np.array_equal(out, np.zeros(5))
    out0 = compute_advantages([0.1] * 5, GROUPS, AGENTS, TRAJS, mode=mode, eps=0.0)
    assert np.array_equal(out0, np.zeros(5))


@pytest.mark.parametrize("mode", ["global", "agent", "step_global"])
def test_singleton_set_reference_gives_raw_reward(mode: str) -> None:
    out = compute_advantages([0.7], ["g"], ["solver"], [0], mode=mode)
    np.testing.assert_allclose(out, [0.7 / (1 + EPS)], rtol=1e-12)
    mean_only = compute_advantages([0.7], ["g"], ["solver"], [0], mode=mode, norm_by_std=False)
    np.testing.assert_allclose(mean_only, [0.7])


def test_singleton_agent_uses_its_running_stats() -> None:
    stats = AgentRewardStats(window=0)
    stats.update(["solver"] * 4 + ["verifier"] * 2, [0.0, 1.0, 1.0, 1.0, 5.0, 7.0])
    m, s = stats.mean("solver"), stats.std("solver")
    assert (m, s) == pytest.approx((0.75, 0.5))
    # solver has one call in group g, the verifier two (so the verifier keeps its in-group statistics)
    out = compute_advantages([0.0, 1.0, 0.0], ["g"] * 3, ["solver", "verifier", "verifier"], [0, 0, 1],
                             mode="agent", running_stats=stats)
    v = math.sqrt(0.5) + EPS
    np.testing.assert_allclose(out, [(0.0 - 0.75) / (0.5 + EPS), 0.5 / v, -0.5 / v], rtol=1e-12)


@pytest.mark.parametrize("mode", ["global", "step_global"])
def test_singleton_pooled_modes_use_all_key(mode: str) -> None:
    stats = AgentRewardStats()
    stats.update(["a", "b", "b"], [0.0, 1.0, 2.0])  # pooled: mean 1, std 1
    out = compute_advantages([3.0], ["g"], ["a"], [0], mode=mode, running_stats=stats)
    np.testing.assert_allclose(out, [2.0 / (1.0 + EPS)], rtol=1e-12)


def test_running_stats_with_too_few_observations_fall_back_to_reference() -> None:
    stats = AgentRewardStats()
    stats.update(["solver"], [0.2])
    out = compute_advantages([0.7], ["g"], ["solver"], [0], running_stats=stats)
    np.testing.assert_allclose(out, [0.7 / (1 + EPS)], rtol=1e-12)


def test_running_std_zero_uses_mean_only() -> None:
    stats = AgentRewardStats()
    stats.update(["solver"] * 3, [1.0, 1.0, 1.0])
    out = compute_advantages([0.9], ["g"], ["solver"], [0], running_stats=stats)
    np.testing.assert_allclose(out, [-0.1 / (1 + EPS)], rtol=1e-9)


def _nearly_always_right() -> AgentRewardStats:
    """An agent right 999 times in 1000: running mean 0.999, std 0.0316."""
    stats = AgentRewardStats(window=0)
    stats.update(["solver"] * 1000, [1.0] * 999 + [0.0])
    return stats


def test_singleton_clip_bounds_one_failure_of_a_nearly_always_right_agent() -> None:
    stats = _nearly_always_right()
    mean, std = stats.mean("solver"), stats.std("solver")
    unbounded = compute_advantages([0.0], ["g"], ["solver"], [0], running_stats=stats)
    assert unbounded[0] == pytest.approx(-mean / (std + EPS)) and unbounded[0] < -30
    bounded = compute_advantages([0.0, 1.0, 0.0, 1.0], ["g", "h", "i", "i"], ["solver"] * 4, [0, 0, 0, 1],
                                 running_stats=stats, singleton_clip=3.0)
    # the failure is bounded, a success keeps its small advantage, a real group is never clipped
    np.testing.assert_allclose(bounded, [-3.0, (1 - mean) / (std + EPS), -0.5 / (math.sqrt(0.5) + EPS),
                                         0.5 / (math.sqrt(0.5) + EPS)], rtol=1e-9)
    # the reference fallback (no statistics) is bounded too, and mean-only singletons as well
    np.testing.assert_allclose(compute_advantages([5.0], ["g"], ["a"], [0], singleton_clip=3.0), [3.0])
    np.testing.assert_allclose(compute_advantages([0.0], ["g"], ["solver"], [0], norm_by_std=False,
                                                  running_stats=stats, singleton_clip=0.5), [-0.5])
    with pytest.raises(ValueError, match="singleton_clip"):
        compute_advantages([1.0], ["g"], ["a"], [0], singleton_clip=0.0)


def test_step_advantages_keep_a_singletons_own_reward_out_of_its_baseline() -> None:
    """The running statistics take a batch's rewards only after its advantages: a singleton's own reward in
    its baseline would pull the advantage towards 0 (here from -0.75 / 0.5 to -0.6 / 0.55)."""
    from drmas.config.schema import AlgorithmConfig
    from drmas.core.sample import Sample
    from drmas.algorithms.estimators import step_advantages

    stats = AgentRewardStats(window=0)
    stats.update(["solver"] * 4, [0.0, 1.0, 1.0, 1.0])  # mean 0.75, std 0.5
    lone = Sample(episode_id="e", group_id="g", agent="solver", model="m", turn=0, prompt_ids=[1],
                  response_ids=[2], behaviour_logprobs=[-1.0], policy_version=0, temperature=1.0, valid=True,
                  reward=0.0)
    out = step_advantages([lone], AlgorithmConfig(), stats)
    np.testing.assert_allclose(out, [-0.75 / (0.5 + EPS)], rtol=1e-12)
    assert stats.count("solver") == 5  # ...and then it joins them


@pytest.mark.parametrize("mode", ["global", "agent", "step_global"])
def test_groups_do_not_mix(mode: str) -> None:
    one = adv(mode)
    shifted = [r + 10.0 for r in REWARDS]  # second group with a very different level
    both = compute_advantages(REWARDS + shifted, GROUPS + ["h"] * 5, AGENTS * 2, TRAJS * 2, mode=mode)
    np.testing.assert_allclose(both[:5], one, rtol=1e-9)
    np.testing.assert_allclose(both[5:], one, rtol=1e-6)  # only float rounding of the +10 shift differs


def test_string_and_int_ids_agree_and_order_is_irrelevant() -> None:
    perm = [3, 0, 4, 2, 1]
    out = compute_advantages(
        [REWARDS[i] for i in perm], [7] * 5, [{"solver": 0, "verifier": 1}[AGENTS[i]] for i in perm],
        [f"t{TRAJS[i]}" for i in perm], mode="agent",
    )
    np.testing.assert_allclose(out, adv("agent")[perm], rtol=1e-12)


def test_trajectory_ids_are_scoped_by_group() -> None:
    # trajectory id 0 exists in both groups; it must not merge into one trajectory
    out = compute_advantages([1.0, 0.0, 0.0, 1.0], ["g", "g", "h", "h"], ["a"] * 4, [0, 1, 0, 1], mode="global")
    a = 0.5 / (math.sqrt(0.5) + EPS)
    np.testing.assert_allclose(out, [a, -a, -a, a], rtol=1e-12)


def test_validation_errors() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        compute_advantages([1.0, 2.0], ["g"], ["a", "a"], [0, 1])
    with pytest.raises(ValueError, match="unknown advantage mode"):
        compute_advantages([1.0], ["g"], ["a"], [0], mode="per_agent")
    with pytest.raises(ValueError, match="non-finite"):
        compute_advantages([1.0, float("nan")], ["g", "g"], ["a", "a"], [0, 1])
    with pytest.raises(ValueError, match="non-finite"):
        compute_advantages([float("inf")], ["g"], ["a"], [0])
    with pytest.raises(ValueError, match="eps"):
        compute_advantages([1.0], ["g"], ["a"], [0], eps=-1.0)
    assert compute_advantages([], [], [], []).shape == (0,)


def _two_agent_batch(rng: np.random.Generator, n_groups: int, n: int, spread_b: float) -> tuple:
    """Groups of n trajectories, one call per agent each: agent A ~ 0.9 +- 0.1, agent B ~ 0.1 +- spread_b."""
    rewards, groups, agents, trajs = [], [], [], []
    for g in range(n_groups):
        for t in range(n):
            for name, mu, sd in (("A", 0.9, 0.1), ("B", 0.1, spread_b)):
                rewards.append(rng.normal(mu, sd)); groups.append(g); agents.append(name); trajs.append(t)
    return np.array(rewards), np.array(groups), np.array(agents), np.array(trajs)


def test_agent_mode_keeps_each_agents_advantage_scale_at_one() -> None:
    """The method's point: pooled statistics mis-scale agents whose rewards differ; per-agent ones do not."""
    n = 8
    r, g, a, t = _two_agent_batch(np.random.default_rng(0), n_groups=200, n=n, spread_b=0.1)
    per_agent = compute_advantages(r, g, a, t, mode="agent")
    for name in ("A", "B"):
        # each (group, agent) set: sum A^2 = (n-1) std^2 / (std+eps)^2, so the mean is just below (n-1)/n
        msq = float(np.mean(per_agent[a == name] ** 2))
        assert msq <= 1.0 and msq == pytest.approx((n - 1) / n, rel=1e-3)

    # step-level pooling: both agents' means sit ~0.4 from the pooled mean, far beyond their own std 0.1,
    # and a wider spread for B makes the two scales unequal: E[A^2] = (sd_k^2 + (mu_k - mu)^2) / sd^2.
    r, g, a, t = _two_agent_batch(np.random.default_rng(1), n_groups=200, n=n, spread_b=0.5)
    pooled = compute_advantages(r, g, a, t, mode="step_global")
    msq = {name: float(np.mean(pooled[a == name] ** 2)) for name in ("A", "B")}
    assert msq["B"] > 1.4 * msq["A"]
    # ...while within an agent, pooled advantages barely reflect its own reward: A's own spread is 0.1
    # against a pooled std of ~0.5, so A's advantages are squeezed into a narrow positive band.
    assert float(np.std(pooled[a == "A"])) < 0.35 and float(np.mean(pooled[a == "A"])) > 0.5
    # vanilla GRPO (trajectory scores) gives every call of a trajectory the same advantage
    glob = compute_advantages(r, g, a, t, mode="global")
    np.testing.assert_array_equal(glob[a == "A"], glob[a == "B"])


def test_large_batch_is_fast() -> None:
    rng = np.random.default_rng(0)
    n = 100_000
    r, g = rng.random(n), rng.integers(0, 2_000, n)
    a, t = rng.choice(np.array(["solver", "verifier", "search"]), n), rng.integers(0, 16, n)
    start = time.perf_counter()
    for mode in ("global", "agent", "step_global"):
        out = compute_advantages(r, g, a, t, mode=mode)
        assert out.shape == (n,) and np.isfinite(out).all()
    assert time.perf_counter() - start < 2.0
