"""The registered advantage estimators against values computed by hand, their edge cases and their contract.

The case: group g has three episodes and group h one. Calls (agent, turn, reward):
    g/e0: solver 0 1.0, verifier 1 0.5 | g/e1: solver 0 0.0, verifier 1 1.0, solver 2 0.0 | g/e2: solver 0 1.0
    h/e0: solver 0 0.5   (a one-episode group; the verifier is absent from e2 and from h)
Trajectory scores: g/e0 0.75, g/e1 1/3, g/e2 1.0, h/e0 0.5. The expected values below are written from each
estimator's definition with numpy's mean/std, not from drmas' set code.
"""

from __future__ import annotations

import numpy as np
import pytest

from drmas.algorithms import ADVANTAGE_ESTIMATORS, AdvantageBatch, estimate
from drmas.algorithms.estimators import step_advantages
from drmas.algorithms.running_stats import ALL, AgentRewardStats
from drmas.config.schema import AlgorithmConfig
from drmas.core.sample import Sample

EPS = 1e-12
CALLS = [("g", "e0", "solver", 0, 1.0), ("g", "e0", "verifier", 1, 0.5), ("g", "e1", "solver", 0, 0.0),
         ("g", "e1", "verifier", 1, 1.0), ("g", "e1", "solver", 2, 0.0), ("g", "e2", "solver", 0, 1.0),
         ("h", "e0", "solver", 0, 0.5)]
SCORES = {"g/e0": 0.75, "g/e1": 1 / 3, "g/e2": 1.0, "h/e0": 0.5}
BUILT_IN = ["agent", "agent_rloo", "batch", "dr_grpo", "global", "rloo", "step_global"]  # drmas/algorithms/


def _sample(group: str, episode: str, agent: str, turn: int, reward: float) -> Sample:
    return Sample(episode_id=f"{group}/{episode}", group_id=group, agent=agent, model="m", turn=turn,
                  prompt_ids=[1], response_ids=[2], behaviour_logprobs=[-1.0], policy_version=0, temperature=1.0,
                  valid=True, reward=reward)


SAMPLES = [_sample(*call) for call in CALLS]


def _alg(name: str, **kw: object) -> AlgorithmConfig:
    return AlgorithmConfig(estimator=name, eps=EPS, singleton_fallback=False, singleton_clip=None, **kw)


def _run(name: str, samples=SAMPLES, stats: AgentRewardStats | None = None, **kw: object) -> np.ndarray:
    return estimate(AdvantageBatch.from_samples(samples), _alg(name, **kw), stats or AgentRewardStats())


def _z(values, mean, std):
    return (np.asarray(values) - mean) / (std + EPS)


def _episode_rows(per_episode: dict[str, float]) -> list[float]:
    return [per_episode[f"{g}/{e}"] for g, e, *_ in CALLS]


def test_the_built_ins_are_registered():
    assert set(BUILT_IN) <= set(ADVANTAGE_ESTIMATORS.names())  # with any plugin's another test loaded


def test_agent_normalises_each_agent_within_its_group():
    solver, verifier = [1.0, 0.0, 0.0, 1.0], [0.5, 1.0]
    s = _z(solver, np.mean(solver), np.std(solver, ddof=1))
    v = _z(verifier, np.mean(verifier), np.std(verifier, ddof=1))
    expected = [s[0], v[0], s[1], v[1], s[2], s[3], 0.5 / (1 + EPS)]  # h: one call, the reference's mean 0 / std 1
    np.testing.assert_allclose(_run("agent"), expected, rtol=1e-12)


def test_global_normalises_trajectory_scores_and_gives_each_call_its_episodes():
    g = [SCORES["g/e0"], SCORES["g/e1"], SCORES["g/e2"]]
    z = dict(zip(["g/e0", "g/e1", "g/e2"], _z(g, np.mean(g), np.std(g, ddof=1))), **{"h/e0": 0.5 / (1 + EPS)})
    np.testing.assert_allclose(_run("global"), _episode_rows(z), rtol=1e-12)


def test_step_global_pools_every_call_of_the_group():
    g = [c[4] for c in CALLS if c[0] == "g"]
    expected = [*_z(g, np.mean(g), np.std(g, ddof=1)), 0.5 / (1 + EPS)]
    np.testing.assert_allclose(_run("step_global"), expected, rtol=1e-12)


def test_dr_grpo_centres_trajectory_scores_without_scaling():
    mean = np.mean([SCORES["g/e0"], SCORES["g/e1"], SCORES["g/e2"]])
    centred = {k: v - mean for k, v in SCORES.items() if k.startswith("g")} | {"h/e0": 0.5}
    np.testing.assert_allclose(_run("dr_grpo"), _episode_rows(centred), rtol=1e-12)
    # norm_by_std does not change it (it is what dr_grpo leaves out)
    np.testing.assert_allclose(_run("dr_grpo", norm_by_std=True), _run("dr_grpo", norm_by_std=False), rtol=0)


def test_batch_scales_the_centred_scores_by_the_batchs_std():
    centred = np.array(_episode_rows({"g/e0": 0.75 - 25 / 36, "g/e1": 1 / 3 - 25 / 36, "g/e2": 1 - 25 / 36,
                                      "h/e0": 0.5}))
    np.testing.assert_allclose(_run("batch"), centred / (np.std(centred, ddof=1) + EPS), rtol=1e-12)


def test_rloo_subtracts_the_mean_of_the_other_episodes():
    s = SCORES
    per = {"g/e0": s["g/e0"] - (s["g/e1"] + s["g/e2"]) / 2, "g/e1": s["g/e1"] - (s["g/e0"] + s["g/e2"]) / 2,
           "g/e2": s["g/e2"] - (s["g/e0"] + s["g/e1"]) / 2, "h/e0": 0.5}  # h: nothing to leave out, baseline 0
    np.testing.assert_allclose(_run("rloo"), _episode_rows(per), rtol=1e-12)


def test_agent_rloo_leaves_out_the_calls_own_episode():
    # solver: e0 1 vs others (0, 0, 1) -> 2/3; e1 0 vs (1, 1) -> -1 (both calls); e2 1 vs (1, 0, 0) -> 2/3
    # verifier: e0 0.5 vs 1 -> -0.5; e1 1 vs 0.5 -> 0.5; h: the solver spoke in one episode only -> 0.5 - 0
    np.testing.assert_allclose(_run("agent_rloo"), [2 / 3, -0.5, -1.0, 0.5, -1.0, 2 / 3, 0.5], rtol=1e-12)


@pytest.mark.parametrize("name", BUILT_IN)
def test_equal_rewards_give_exactly_zero(name):
    samples = [_sample("g", f"e{i}", agent, t, 0.1) for i in range(3) for t, agent in enumerate(["solver", "verifier"])]
    assert (_run(name, samples) == 0.0).all()


@pytest.mark.parametrize("name", BUILT_IN)
def test_a_group_of_one_call_is_centred_on_the_running_mean_and_clipped(name):
    stats = AgentRewardStats()
    stats.update(["solver"] * 4, [0.2, 0.2, 0.4, 0.4])  # solver and pooled: mean 0.3, std 0.1155
    lone = [_sample("h", "e0", "solver", 0, 0.9)]
    fallback = AlgorithmConfig(estimator=name, eps=EPS, singleton_fallback=True, singleton_clip=None)
    out = float(estimate(AdvantageBatch.from_samples(lone), fallback, stats)[0])
    scaled = {"agent", "global", "step_global"}  # these divide by the running std too; the others only centre
    assert out == pytest.approx(0.6 / (stats.std(ALL) + EPS) if name in scaled else 0.6, rel=1e-9)
    clipped = AlgorithmConfig(estimator=name, eps=EPS, singleton_fallback=True, singleton_clip=0.5)
    assert float(estimate(AdvantageBatch.from_samples(lone), clipped, stats)[0]) == pytest.approx(0.5)


def test_a_learners_calls_are_scored_against_their_whole_group():
    """Only the solver's calls are scored, but the pooled and per-episode estimators see the verifier's too."""
    solver = [s for s in SAMPLES if s.agent == "solver"]
    batch = AdvantageBatch.from_samples(solver, SAMPLES)
    rows = [i for i, s in enumerate(SAMPLES) if s.agent == "solver"]
    for name in ("global", "step_global", "rloo", "dr_grpo", "agent", "agent_rloo"):
        np.testing.assert_allclose(estimate(batch, _alg(name), AgentRewardStats()), _run(name)[rows], rtol=1e-12)


def test_step_advantages_update_the_statistics_only_after_the_estimate():
    stats = AgentRewardStats()
    lone = [_sample("h", "e0", "solver", 0, 1.0)]
    assert step_advantages(lone, AlgorithmConfig(estimator="rloo"), stats)[0] == 1.0  # no earlier rewards
    assert stats.count("solver") == 1 and stats.mean(ALL) == 1.0


def test_bad_input_is_refused_with_what_is_wrong():
    with pytest.raises(ValueError, match="non-finite"):
        AdvantageBatch.from_samples([_sample("g", "e0", "solver", 0, 0.0)]).__class__(
            reward=np.array([np.nan]), group=np.array(["g"]), episode=np.array(["e0"]), agent=np.array(["a"]),
            turn=np.array([0]), episode_scores={("g", "e0"): 0.0}, group_rewards={"g": np.array([0.0])})
    base = AdvantageBatch.from_samples(SAMPLES)
    with pytest.raises(ValueError, match="equal lengths"):
        AdvantageBatch(base.reward[:2], base.group, base.episode, base.agent, base.turn, base.episode_scores,
                       base.group_rewards)
    with pytest.raises(ValueError, match="no trajectory score"):
        AdvantageBatch(base.reward, base.group, base.episode, base.agent, base.turn, {}, base.group_rewards)
    with pytest.raises(ValueError, match="no group_rewards"):
        AdvantageBatch(base.reward, base.group, base.episode, base.agent, base.turn, base.episode_scores, {})
    with pytest.raises(ValueError, match="algorithm.estimator: 'agentwise' is not a registered"):
        estimate(base, AlgorithmConfig(estimator="agentwise"), AgentRewardStats())


def test_an_estimators_output_is_checked(monkeypatch):
    bad = {"nan_out": lambda batch, ctx: np.full(len(batch), np.nan), "short": lambda batch, ctx: np.zeros(1)}
    for name, fn in bad.items():
        monkeypatch.setitem(ADVANTAGE_ESTIMATORS._items, name, fn)
    with pytest.raises(ValueError, match="'nan_out'.*non-finite"):
        _run("nan_out")
    with pytest.raises(ValueError, match="'short' returned shape"):
        _run("short")


def test_a_taken_name_cannot_be_registered_again():
    with pytest.raises(ValueError, match="already registered"):
        ADVANTAGE_ESTIMATORS.register("agent")(lambda batch, ctx: batch.reward)
