"""The pooled normalisation modes of the async pipeline equal the colocated loop's, through a real buffer.

A learner gets its agents' parts of a group, not the group: an agent that made no call in one group makes
another group's parts arrive first, so one group's parts can land in two learner steps; a part may be
dropped; other parts belong to agents of other models or to frozen agents, whose calls never reach a
learner. `step_global` (every call of the group pooled) and `global` (every episode's trajectory score)
must still see the whole group, exactly as the colocated loop does with every sample in hand.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest
from buffer_harness import clients, make_buffer, wait_until  # noqa: F401  (fixtures)

from test_episodes import ScriptedEngine

from drmas.config.schema import AlgorithmConfig
from drmas.core.sample import Sample
from drmas.engines.base import SamplingParams
from drmas.algorithms import AdvantageBatch, estimate
from drmas.algorithms.estimators import step_advantages
from drmas.learner.batch import GroupCollector, group_advantages
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.mas.base import AgentTurn, EpisodeOutcome, TurnResult
from drmas.episodes import AgentSpec, EpisodeRequest, EpisodeRunner
from drmas.runtime.process import StopFlag
from drmas.tasks.base import Problem

BUILT_IN = ["agent", "agent_rloo", "batch", "dr_grpo", "global", "rloo", "step_global"]  # the registered estimators
AGENT_MODELS = {"solver": "m", "verifier": "m", "reviser": "other"}  # the critic is frozen: no learner, no queue
FROZEN = "critic"
GROUP_SIZE = 3
# group -> episodes -> calls (agent, reward). In g0 the verifier never speaks, so with one group per step the
# pull that should bring g0 also brings the verifier's part of g1, and g1's solver part lands in the next step.
GROUPS = {
    "g0": [[("solver", 1.0), (FROZEN, 0.9)], [("solver", 0.0), (FROZEN, 0.1)], [("solver", 0.0), ("reviser", 1.0)]],
    "g1": [[("solver", 1.0), ("verifier", 0.9), (FROZEN, -0.1)], [("solver", 0.0), ("verifier", 0.0)],
           [("solver", 1.0), ("verifier", 1.0), ("reviser", 0.3), (FROZEN, 1.0)]],
}


def _episode(group: str, index: int) -> list[Sample]:
    return [Sample(episode_id=f"{group}-e{index}", group_id=group, agent=agent, model=AGENT_MODELS.get(agent, "frozen"),
                   turn=turn, prompt_ids=[1, 2], response_ids=[3], behaviour_logprobs=[-1.0], policy_version=0,
                   temperature=1.0, valid=True, reward=reward)
            for turn, (agent, reward) in enumerate(GROUPS[group][index])]


def _colocated(samples: Sequence[Sample], name: str) -> dict[tuple[str, str, int], float]:
    """What the colocated loop computes: each model's calls against every call of their groups in hand, frozen
    ones included (drmas.colocated.ColocatedRun._advantages)."""
    alg = AlgorithmConfig(estimator=name, singleton_fallback=False)
    out = {}
    for model in ("m", "other"):
        mine = [s for s in samples if AGENT_MODELS.get(s.agent) == model]
        adv = estimate(AdvantageBatch.from_samples(mine, samples), alg, AgentRewardStats())
        out.update({(s.episode_id, s.agent, s.turn): a for s, a in zip(mine, adv)})
    return out


def _send_all(producer) -> list[Sample]:
    every = []
    for group, episodes in GROUPS.items():
        for index in range(len(episodes)):
            samples = _episode(group, index)
            every += samples
            sent = [s for s in samples if s.agent in AGENT_MODELS]
            frozen = [s.reward for s in samples if s.agent not in AGENT_MODELS]
            producer.send_episode(group, GROUP_SIZE, samples[0].episode_id, sent, frozen_rewards=frozen)
    producer.flush(timeout_s=5)
    return every


# `batch` scales by the step's batch, which differs when a group's parts land in two steps (docs/algorithms.md)
@pytest.mark.parametrize("mode", [n for n in BUILT_IN if n != "batch"])
def test_every_estimator_sees_the_whole_group_however_its_parts_are_delivered(make_buffer, clients, mode):
    buf = make_buffer(agent_models=AGENT_MODELS)
    every = _send_all(clients.producer(buf))
    wait_until(lambda: buf.stats().depth == {"solver": 2, "verifier": 1, "reviser": 2})
    expected = _colocated(every, mode)
    alg = AlgorithmConfig(estimator=mode, singleton_fallback=False)
    collector = GroupCollector(clients.consumer(buf), ["solver", "verifier"], 1, 1, StopFlag(install=False), poll_ms=50)

    steps = []
    for _ in range(2):  # one group per step, as the learner of model m asks
        batch = collector.next_batch(0)
        samples, adv = group_advantages(batch.groups, alg, AgentRewardStats())
        steps.append(sorted({s.group_id for s in samples}))
        for s, a in zip(samples, adv):
            assert a == pytest.approx(expected[(s.episode_id, s.agent, s.turn)], rel=1e-12, abs=1e-12), (s.agent, s.turn)
    # a step of one group trains one: g1's verifier part, pulled with g0, waits for the next step, which its
    # solver part joins (tests/test_learner_batch.py has parts of one group split over two steps)
    assert steps == [["g0"], ["g1"]]

    # the learner of the other model, with its one agent, gets the same numbers for its calls
    other = GroupCollector(clients.consumer(buf), ["reviser"], 2, 1, StopFlag(install=False), poll_ms=50)
    samples, adv = group_advantages(other.next_batch(0).groups, alg, AgentRewardStats())
    assert [s.agent for s in samples] == ["reviser", "reviser"]
    np.testing.assert_allclose(adv, [expected[(s.episode_id, s.agent, s.turn)] for s in samples], rtol=1e-12)


def test_episode_scores_count_the_calls_of_frozen_agents(make_buffer, clients):
    """The trajectory score is the mean reward of all the episode's calls in both loops, frozen ones included."""
    buf = make_buffer(agent_models=AGENT_MODELS)
    _send_all(clients.producer(buf))
    parts = clients.consumer(buf).pull(["solver"], max_groups=2, wait_ms=2000)
    scores = {e: s for part in parts for e, s in part.episode_scores.items()}
    assert scores["g0-e0"] == pytest.approx((1.0 + 0.9) / 2) and scores["g1-e0"] == pytest.approx((1.0 + 0.9 - 0.1) / 3)
    g1 = next(part for part in parts if part.group_id == "g1")
    assert sorted(g1.group_rewards) == sorted(r for episode in GROUPS["g1"] for _, r in episode)


def test_a_non_finite_frozen_reward_is_refused_like_a_non_finite_sample_reward(make_buffer, clients):
    buf = make_buffer(agent_models=AGENT_MODELS)
    producer = clients.producer(buf)
    sent = [s for s in _episode("g0", 0) if s.agent in AGENT_MODELS]
    producer.send_episode("g0", GROUP_SIZE, "g0-e0", sent, frozen_rewards=[float("nan")])
    producer.flush(timeout_s=5)
    assert [r.reason for r in producer.pop_rejections()] == ["invalid"]
    assert buf.stats().received_samples == 0


@pytest.mark.parametrize("mode", ["agent", "step_global", "global"])
def test_an_episode_in_which_no_trained_agent_spoke_still_completes_its_group(make_buffer, clients, mode):
    """A router that answers at once makes an episode of frozen calls only: sent with its rewards alone, it
    completes the group (which would otherwise wait out the incomplete timeout and be lost) and counts in
    the pooled scores, so every mode's advantages equal the colocated loop's."""
    episodes = [[(FROZEN, 0.5)], [("solver", 1.0), (FROZEN, 0.2)], [("solver", 0.0), ("verifier", 1.0)]]
    every = []
    buf = make_buffer(agent_models=AGENT_MODELS)
    producer = clients.producer(buf)
    for index, calls in enumerate(episodes):
        samples = [Sample(episode_id=f"g9-e{index}", group_id="g9", agent=agent, model=AGENT_MODELS.get(agent, "f"),
                          turn=turn, prompt_ids=[1, 2], response_ids=[3], behaviour_logprobs=[-1.0],
                          policy_version=0, temperature=1.0, valid=True, reward=reward)
                   for turn, (agent, reward) in enumerate(calls)]
        every += samples
        producer.send_episode("g9", GROUP_SIZE, f"g9-e{index}", [s for s in samples if s.agent in AGENT_MODELS],
                              frozen_rewards=[s.reward for s in samples if s.agent not in AGENT_MODELS])
    producer.send_episode("g8", GROUP_SIZE, "g8-e0", [])  # no call at all: nothing to score it by
    producer.flush(timeout_s=5)
    assert [(r.episode_id, r.reason) for r in producer.pop_rejections()] == [("g8-e0", "invalid")]
    wait_until(lambda: buf.stats().depth == {"solver": 1, "verifier": 1})

    collector = GroupCollector(clients.consumer(buf), ["solver", "verifier"], 1, 1, StopFlag(install=False), poll_ms=50)
    parts = collector.next_batch(0).groups
    assert {p.agent: len(p.samples) for p in parts} == {"solver": 2, "verifier": 1}
    assert parts[0].episode_scores["g9-e0"] == pytest.approx(0.5)
    samples, adv = group_advantages(parts, AlgorithmConfig(estimator=mode, singleton_fallback=False),
                                    AgentRewardStats())
    expected = _colocated(every, mode)
    np.testing.assert_allclose(adv, [expected[(s.episode_id, s.agent, s.turn)] for s in samples], rtol=1e-12, atol=1e-12)


# --- per-turn rewards: a hand-computed case, the same in both loops -----------------------------------------------

# Episode i of the group: which agents speak (env is scripted: no sample, no reward) and the outcome's rewards.
# e2 exercises the precedence: its shared reward is 1, but turn_rewards zero the first solver turn and the
# verifier, and agent_rewards zero the last solver turn (its turn_rewards entry is None).
PLAN = [("solver", "env", "verifier"), ("solver", "env", "verifier"), ("solver", "env", "verifier", "solver")]
OUTCOMES = [dict(reward=1.0, agent_rewards={"solver": 1.0, "verifier": 1.0}),
            dict(reward=0.0, agent_rewards={"verifier": 1.0}),
            dict(reward=1.0, agent_rewards={"solver": 0.0}, turn_rewards=[0.0, None, 0.0, None])]
# Sample rewards: solver 1, 0, 0, 0 and verifier 1, 1, 0; every trajectory's score is the mean of its samples'.
SQRT3, SQRT14 = 3 ** 0.5, 14 ** 0.5
EXPECTED = {
    # each agent against its own calls: solver mean 1/4, std 1/2; verifier mean 2/3, std 1/sqrt(3)
    "agent": {("e0", "solver"): 1.5, ("e1", "solver"): -0.5, ("e2", "solver"): -0.5,
              ("e0", "verifier"): 1 / SQRT3, ("e1", "verifier"): 1 / SQRT3, ("e2", "verifier"): -2 / SQRT3},
    # all seven calls pooled: mean 3/7, std sqrt(2/7): a reward 1 gets 4/sqrt(14), a reward 0 -3/sqrt(14)
    "step_global": {("e0", "solver"): 4 / SQRT14, ("e1", "solver"): -3 / SQRT14, ("e2", "solver"): -3 / SQRT14,
                    ("e0", "verifier"): 4 / SQRT14, ("e1", "verifier"): 4 / SQRT14, ("e2", "verifier"): -3 / SQRT14},
    # trajectory scores 1, 1/2, 0 (mean 1/2, std 1/2): every call of an episode takes its episode's advantage
    "global": {("e0", "solver"): 1.0, ("e1", "solver"): 0.0, ("e2", "solver"): -1.0,
               ("e0", "verifier"): 1.0, ("e1", "verifier"): 0.0, ("e2", "verifier"): -1.0},
}


class _PerTurnRewards:
    """Episodes of PLAN with the rewards of OUTCOMES, in the order they are started."""

    agents = ("solver", "verifier", "env")

    def __init__(self) -> None:
        self.started = 0

    def run(self, problem):
        index, self.started = self.started, self.started + 1
        turns = []
        for agent in PLAN[index]:
            text = yield AgentTurn(agent, [{"role": "user", "content": problem.question}], state=index)
            turns.append(TurnResult(agent, text, valid=True))
        return EpisodeOutcome(turns=turns, **OUTCOMES[index])


def _per_turn_episodes() -> list[Sample]:
    specs = {"solver": AgentSpec("m", SamplingParams()), "verifier": AgentSpec("m", SamplingParams()),
             "env": AgentSpec("", None, script=lambda turn: f"observation {turn.state}")}
    requests = [EpisodeRequest(f"e{i}", "g", Problem("p", "1 + 1?", "2")) for i in range(GROUP_SIZE)]
    results = EpisodeRunner(_PerTurnRewards(), {"m": ScriptedEngine()}, specs, invalid_penalty=0.1, seed=0).run(requests)
    return [s for r in results for s in r.samples]


@pytest.mark.parametrize("mode", BUILT_IN)
def test_per_turn_rewards_give_the_hand_computed_advantages_in_both_loops(make_buffer, clients, mode):
    """Rewards that differ per turn and per agent, from an orchestra through the episode runner: the colocated
    loop's advantages (every sample in hand) and the async pipeline's (each sample sent through a real buffer,
    pulled by a learner's collector) are equal for every estimator, and equal the case computed by hand above
    for the three it covers (tests/test_estimators.py has hand values for each)."""
    samples = _per_turn_episodes()
    assert [(s.episode_id, s.agent, s.turn, s.reward) for s in samples] == [
        ("e0", "solver", 0, 1.0), ("e0", "verifier", 2, 1.0), ("e1", "solver", 0, 0.0), ("e1", "verifier", 2, 1.0),
        ("e2", "solver", 0, 0.0), ("e2", "verifier", 2, 0.0), ("e2", "solver", 3, 0.0)]
    alg = AlgorithmConfig(estimator=mode, singleton_fallback=False, eps=1e-12)
    colocated = step_advantages(samples, alg, AgentRewardStats())

    buf = make_buffer(agent_models={"solver": "m", "verifier": "m"})
    producer = clients.producer(buf)
    for episode in ("e0", "e1", "e2"):  # as the rollout worker sends them: every sample of a trained agent
        producer.send_episode("g", GROUP_SIZE, episode, [s for s in samples if s.episode_id == episode])
    producer.flush(timeout_s=5)
    collector = GroupCollector(clients.consumer(buf), ["solver", "verifier"], 1, 1, StopFlag(install=False), poll_ms=50)
    pulled, pipelined = group_advantages(collector.next_batch(0).groups, alg, AgentRewardStats())

    by_call = {(s.episode_id, s.agent, s.turn): a for s, a in zip(samples, colocated)}
    for s, a in zip(pulled, pipelined):
        assert a == pytest.approx(by_call[(s.episode_id, s.agent, s.turn)], rel=1e-12, abs=1e-12)
    assert len(pulled) == len(samples)
    for s, a in zip(samples, colocated if mode in EXPECTED else ()):
        assert a == pytest.approx(EXPECTED[mode][(s.episode_id, s.agent)], rel=1e-9), (mode, s.episode_id, s.agent)
