"""A learner's step batch without processes: group counting, stale drops, and advantages from agent groups."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from drmas.buffer import AgentGroup
from drmas.config.schema import AlgorithmConfig
from drmas.core.lineage import Lineage
from drmas.core.sample import Sample
from drmas.algorithms.advantage import compute_advantages
from drmas.learner.batch import GroupCollector, group_advantages
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.runtime.process import StopFlag


def _sample(group: str, episode: str, agent: str, reward: float, version: int = 0, incarnation: str = "") -> Sample:
    return Sample(episode_id=episode, group_id=group, agent=agent, model="m", turn=0, prompt_ids=[1],
                  response_ids=[2], behaviour_logprobs=[-1.0], policy_version=version, temperature=1.0,
                  valid=True, reward=reward, policy_incarnation=incarnation)


def _part(group: str, agent: str, rewards: dict[str, float], scores: dict[str, float] | None = None,
          version: int = 0, incarnation: str = "") -> AgentGroup:
    samples = [_sample(group, e, agent, r, version, incarnation) for e, r in rewards.items()]
    return AgentGroup(group_id=group, agent=agent, model="m", samples=samples,
                      episode_scores=scores or dict(rewards))


class FakeConsumer:
    """Hands out queued parts `max_groups` at a time and records drop reports."""

    def __init__(self, parts: list[AgentGroup]) -> None:
        self.parts = list(parts)
        self.pulls: list[int] = []
        self.reports: list[tuple] = []

    def pull(self, agents, max_groups=1, wait_ms=0):
        self.pulls.append(max_groups)
        taken, self.parts = self.parts[:max_groups], self.parts[max_groups:]
        return taken

    def report_drops(self, agent, group_ids, n_samples, reason):
        self.reports.append((agent, list(group_ids), n_samples, reason))

    def pop_undecodable(self):
        return Counter()


def test_collector_counts_groups_not_parts_and_drops_stale_parts_whole():
    parts = [
        _part("g0", "a", {"e0": 1.0}, version=3),  # lag 2 at version 5: beyond the bound of 1
        _part("g1", "a", {"e1": 1.0, "e2": 0.0}, version=4), _part("g1", "b", {"e1": 1.0}, version=4),
        _part("g2", "a", {"e3": 0.0, "e4": 1.0}, version=5), _part("g2", "b", {"e3": 0.0}, version=5),
        _part("g3", "a", {"e5": 1.0}, version=5),
    ]
    consumer = FakeConsumer(parts)
    collector = GroupCollector(consumer, ["a", "b"], groups_per_step=2, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=0)
    batch = collector.next_batch(version=5)
    assert consumer.pulls == [4]  # 2 missing groups x 2 agents
    assert [(p.group_id, p.agent) for p in batch.groups] == [("g1", "a"), ("g1", "b"), ("g2", "a")]
    assert consumer.reports == [("a", ["g0"], 1, "stale")] and batch.dropped == {"stale": 1}
    assert len(batch.samples) == 5
    # g2's other part arrives with the next step: counted again there, so a step never waits for it
    batch = collector.next_batch(version=6)
    assert consumer.pulls == [4, 4]
    assert [(p.group_id, p.agent) for p in batch.groups] == [("g2", "b"), ("g3", "a")] and not batch.dropped


def test_collector_trains_a_makeup_part_on_top_of_the_steps_groups_and_never_a_draw_twice():
    """Draw 4 was drawn again for agent a alone (b trained it): a's part comes on top of two fresh groups, b's is
    dropped; so over its steps each agent trains as many groups as in an uninterrupted run."""
    trained = {"a": {0}, "b": {0, 4}}
    parts = [_part("g4", "a", {"e0": 1.0}), _part("g4", "b", {"e0": 1.0}),
             _part("g5", "a", {"e1": 1.0}), _part("g5", "b", {"e1": 1.0}),
             _part("g6", "a", {"e2": 1.0}), _part("g6", "b", {"e2": 1.0}), _part("g0", "a", {"e3": 1.0})]
    for part, draw in zip(parts, (4, 4, 5, 5, 6, 6, 0)):
        part.draw = draw
    consumer = FakeConsumer(parts)
    collector = GroupCollector(consumer, ["a", "b"], groups_per_step=2, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=0,
                               trained=lambda part: part.draw in trained[part.agent],
                               makeup=lambda part: any(part.draw in trained[x] for x in "ab" if x != part.agent))
    batch = collector.next_batch(version=0)
    assert [(p.group_id, p.agent) for p in batch.groups] == [("g4", "a"), ("g5", "a"), ("g5", "b"), ("g6", "a"),
                                                             ("g6", "b")]
    assert consumer.reports == [("b", ["g4"], 1, "already_trained")]
    assert batch.prompts_record()["agents"] == {"a": [4, 5, 6], "b": [5, 6]}


def test_collector_drops_parts_made_by_versions_a_killed_learner_published_after_its_checkpoint():
    lineage = Lineage("y").resumed(Lineage("x").state_dict(), version=5)  # x reached 6, saved 5, was killed
    parts = [
        _part("g0", "a", {"e0": 1.0}, version=6, incarnation="x"),  # lost weights, numbered like y's next
        _part("g1", "a", {"e1": 1.0}, version=5, incarnation="x"),  # x's 5 is the checkpoint y resumed
        _part("g2", "a", {"e2": 1.0, "e3": 0.0}, version=6, incarnation="y"),
    ]
    consumer = FakeConsumer(parts)
    collector = GroupCollector(consumer, ["a"], groups_per_step=2, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=0)
    batch = collector.next_batch(version=6, lineage=lineage)
    assert [p.group_id for p in batch.groups] == ["g1", "g2"]
    assert consumer.reports == [("a", ["g0"], 1, "orphaned")] and batch.dropped == {"orphaned": 1}


def test_collector_drops_parts_the_model_cannot_take_with_their_reason():
    from drmas.learner.sample_limits import SampleLimits

    limits = SampleLimits(vocab_size=100, max_tokens=8)
    too_long, bad_token, negative, nan_reward = (_part(f"g{i}", "a", {f"e{i}": 1.0}) for i in range(4))
    too_long.samples[0].prompt_ids = [1] * 8
    bad_token.samples[0].response_ids = [100]
    negative.samples[0].prompt_ids = [-1]
    nan_reward.samples[0].reward = float("nan")
    good = _part("g9", "a", {"e8": 1.0, "e9": 0.0})
    consumer = FakeConsumer([too_long, bad_token, negative, nan_reward, good])
    collector = GroupCollector(consumer, ["a"], groups_per_step=1, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=0, limits=limits)
    batch = collector.next_batch(version=0)
    assert [p.group_id for p in batch.groups] == ["g9"]
    assert batch.dropped == {"too_long": 1, "bad_token": 2, "non_finite": 1}
    assert [r[3] for r in consumer.reports] == ["too_long", "bad_token", "bad_token", "non_finite"]


def test_sample_limits_come_from_the_model(tiny_model):
    from drmas.learner.sample_limits import SampleLimits

    model, _ = tiny_model
    limits = SampleLimits.of_model(model, configured_max=100_000)
    assert limits.vocab_size == model.get_input_embeddings().num_embeddings
    assert limits.max_tokens == model.config.max_position_embeddings
    assert SampleLimits.of_model(model, configured_max=16).max_tokens == 16


def test_collector_returns_none_once_stopped():
    stop = StopFlag(install=False)
    collector = GroupCollector(FakeConsumer([]), ["a"], 1, 0, stop, poll_ms=0)
    stop.set()
    assert collector.next_batch(0) is None


def test_agent_mode_normalises_each_agent_within_its_group():
    parts = [_part("g1", "a", {"e1": 1.0, "e2": 0.0}), _part("g1", "b", {"e1": 0.5, "e2": 0.3})]
    samples, adv = group_advantages(parts, AlgorithmConfig(estimator="agent"), AgentRewardStats())
    expected = compute_advantages([1.0, 0.0, 0.5, 0.3], ["g1"] * 4, ["a", "a", "b", "b"], ["e1", "e2", "e1", "e2"])
    assert [s.agent for s in samples] == ["a", "a", "b", "b"]
    np.testing.assert_allclose(adv, expected)


def test_global_mode_scores_every_episode_of_the_group_even_those_without_our_agents():
    # four episodes; this learner's agent only spoke in three of them (e4 belongs to another model's agent)
    scores = {"e1": 1.0, "e2": 0.0, "e3": 0.0, "e4": 1.0}
    part = _part("g1", "a", {"e1": 0.9, "e2": 0.1, "e3": 0.2}, scores=scores)
    samples, adv = group_advantages([part], AlgorithmConfig(estimator="global"), AgentRewardStats())
    mean, std = 0.5, np.std([1, 0, 0, 1], ddof=1)
    np.testing.assert_allclose(adv, [(1 - mean) / (std + 1e-6), -mean / (std + 1e-6), -mean / (std + 1e-6)])


def test_running_stats_see_every_consumed_reward():
    stats = AgentRewardStats()
    group_advantages([_part("g1", "a", {"e1": 1.0, "e2": 0.0})], AlgorithmConfig(), stats)
    assert stats.count("a") == 2 and stats.mean("a") == pytest.approx(0.5)


def test_collector_keeps_whole_groups_past_the_step_for_the_next_one():
    """Agents a and b, but the episodes called only a: the pull for 2 groups x 2 agents brings 4 of a's groups.
    A step trains its 2 groups (a step of 4 would be two steps' samples in one update); the other 2 are the next
    step's, first in line and checked against the bound again there."""
    parts = [_part(f"g{i}", "a", {f"e{i}": float(i % 2)}, version=v) for i, v in enumerate((4, 4, 4, 5))]
    consumer = FakeConsumer(parts)
    collector = GroupCollector(consumer, ["a", "b"], groups_per_step=2, max_staleness=1,
                               stop=StopFlag(install=False), poll_ms=0)
    batch = collector.next_batch(version=5)
    assert consumer.pulls == [4] and [p.group_id for p in batch.groups] == ["g0", "g1"]
    batch = collector.next_batch(version=5)  # the next step's two, without a pull
    assert consumer.pulls == [4] and [p.group_id for p in batch.groups] == ["g2", "g3"]
    consumer.parts = [_part(f"g{i}", "a", {f"e{i}": 1.0}, version=v) for i, v in ((4, 4), (5, 5), (6, 6), (7, 6))]
    batch = collector.next_batch(version=6)
    assert [p.group_id for p in batch.groups] == ["g5", "g6"] and batch.dropped == {"stale": 1}  # g4, 2 behind
    consumer.parts = [_part(f"g{i}", "a", {f"e{i}": 1.0}, version=8) for i in (8, 9)]
    batch = collector.next_batch(version=8)  # g7 (version 6) waited: 2 behind now, dropped there
    assert consumer.pulls == [4, 4, 4] and [p.group_id for p in batch.groups] == ["g8", "g9"]
    assert batch.dropped == {"stale": 1} and consumer.reports[-1] == ("a", ["g7"], 1, "stale")
