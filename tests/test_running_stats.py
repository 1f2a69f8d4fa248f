"""AgentRewardStats against numpy on the same values: windowed eviction, unbounded Welford, checkpoints."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from drmas.algorithms.running_stats import AgentRewardStats


def _stream(seed: int, n_batches: int = 40) -> list[tuple[list[str], list[float]]]:
    """Batches of uneven size (some larger than the window) with agents at very different levels."""
    rng = np.random.default_rng(seed)
    level = {"solver": 1e6, "verifier": -3.0, "search": 0.5}  # 1e6 offset stresses numerical soundness
    batches = []
    for _ in range(n_batches):
        size = int(rng.integers(0, 60))
        agents = rng.choice(list(level), size).tolist()
        batches.append((agents, [level[a] + rng.normal() for a in agents]))
    return batches


def _reference(batches: list[tuple[list[str], list[float]]], key: str, window: int) -> np.ndarray:
    values = [r for agents, rewards in batches for a, r in zip(agents, rewards) if key in (a, "__all__")]
    arr = np.array(values)
    return arr[-window:] if window else arr


@pytest.mark.parametrize("window", [1, 7, 50, 0])
def test_matches_numpy_on_last_window_values(window: int) -> None:
    batches = _stream(0)
    stats = AgentRewardStats(window=window)
    for agents, rewards in batches:
        stats.update(agents, rewards)
    assert stats.agents() == ["search", "solver", "verifier"]
    for key in stats.agents() + ["__all__"]:
        ref = _reference(batches, key, window)
        assert stats.count(key) == ref.size
        assert stats.mean(key) == pytest.approx(ref.mean(), rel=1e-12, abs=1e-12)
        if ref.size > 1:
            assert stats.std(key) == pytest.approx(ref.std(ddof=1), rel=1e-7)
        else:
            assert math.isnan(stats.std(key))


def test_unknown_agent_and_single_value() -> None:
    stats = AgentRewardStats()
    assert stats.count("nobody") == 0 and math.isnan(stats.mean("nobody")) and math.isnan(stats.std("nobody"))
    stats.update(["a"], [2.0])
    assert stats.count("a") == 1 and stats.mean("a") == 2.0 and math.isnan(stats.std("a"))


@pytest.mark.parametrize("window", [16, 0])
def test_state_round_trip_through_json_is_exact(window: int) -> None:
    batches = _stream(1)
    stats = AgentRewardStats(window=window)
    for agents, rewards in batches[:20]:
        stats.update(agents, rewards)
    restored = AgentRewardStats(window=window)
    restored.load_state_dict(json.loads(json.dumps(stats.state_dict())))
    assert restored.summary() == stats.summary()
    for agents, rewards in batches[20:]:  # continuing from the checkpoint gives bit-identical results
        stats.update(agents, rewards)
        restored.update(agents, rewards)
    assert json.dumps(restored.state_dict()) == json.dumps(stats.state_dict())


def test_load_rejects_other_window() -> None:
    with pytest.raises(ValueError, match="window"):
        AgentRewardStats(window=8).load_state_dict(AgentRewardStats(window=16).state_dict())


def test_summary_includes_pooled_key() -> None:
    stats = AgentRewardStats()
    stats.update(["a", "a", "b", 3], [1.0, 3.0, 5.0, 7.0])  # int ids are stored as strings
    summary = stats.summary()
    assert set(summary) == {"a", "b", "3", "__all__"}
    assert summary["a"] == {"mean": 2.0, "std": pytest.approx(math.sqrt(2.0)), "count": 2.0}
    assert summary["__all__"]["mean"] == 4.0 and summary["__all__"]["count"] == 4.0
    assert stats.count(3) == 1


def test_validation() -> None:
    stats = AgentRewardStats()
    with pytest.raises(ValueError, match="equal in length"):
        stats.update(["a", "b"], [1.0])
    with pytest.raises(ValueError, match="non-finite"):
        stats.update(["a"], [float("nan")])
    with pytest.raises(ValueError, match="reserved"):
        stats.update(["__all__"], [1.0])
    with pytest.raises(ValueError, match="window"):
        AgentRewardStats(window=-1)
    stats.update([], [])
    assert stats.agents() == [] and stats.summary() == {}
