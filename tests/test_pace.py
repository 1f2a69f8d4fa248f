"""drmas.runtime.pace: generation seconds per step from the rollouts' records, the learner's update, and the
advice each side of r = generation / update gets."""

from __future__ import annotations

import pytest

from drmas.runtime.pace import Pace, pace_of, rollout_capacity


def _rollout(busy_shares: list[float], episodes_per_s: list[float], every_s: float = 5.0) -> list[dict]:
    return [{"step": i, "time": 100.0 + i * every_s, "idle/rollout": 1.0 - b, "throughput/rollout/episodes_per_s": e}
            for i, (b, e) in enumerate(zip(busy_shares, episodes_per_s))]


def _learner(model: str, updates: list[float], push: float = 0.5, idle: float = 0.0) -> list[dict]:
    return [{"step": i + 1, f"time/{model}/update_seconds": u, f"weight_sync/{model}/seconds": push,
             f"idle/{model}": idle} for i, u in enumerate(updates)]


def test_rollout_capacity_counts_each_record_over_the_time_since_the_one_before():
    # the first record's span is unknown (skipped); then 5 s at 40% busy making 0.8 episodes/s, 10 s at 100% and 2/s
    records = _rollout([1.0, 0.4], [9.0, 0.8]) + [{"step": 2, "time": 115.0, "idle/rollout": 0.0,
                                                   "throughput/rollout/episodes_per_s": 2.0}]
    assert rollout_capacity(records) == pytest.approx((4.0 + 20.0, 2.0 + 10.0))
    assert rollout_capacity(records[:1]) == (0.0, 0.0)


def test_pace_of_a_learner_bound_run():
    # one rollout: 2 episodes per busy second; 8 episodes a step take it 4 s; updates of 20 s (median, first skipped)
    pace = pace_of("m", _learner("m", [60.0, 20.0, 19.0, 21.0]), [_rollout([0.2] * 5, [0.4] * 5)], 8, 1)
    assert (pace.generation_s, pace.update_s, pace.push_s) == pytest.approx((4.0, 20.0, 0.5))
    assert pace.ratio == pytest.approx(0.2)
    assert "the learner bounds the run" in pace.line() and "max_staleness" not in pace.line()
    on_policy = pace_of("m", _learner("m", [60.0, 20.0]), [_rollout([0.2] * 5, [0.4] * 5)], 8, 0)
    assert "pipeline.max_staleness=1 would overlap generation with the update (up to 1.20x)" in on_policy.line()


def test_pace_of_a_rollout_bound_run_counts_every_rollout():
    # two rollouts, each 1 episode per busy second: 16 episodes take 8 s of both; updates of 2 s
    rollouts = [_rollout([1.0] * 4, [1.0] * 4), _rollout([1.0] * 4, [1.0] * 4)]
    pace = pace_of("m", _learner("m", [9.0, 2.0, 2.0], idle=0.75), rollouts, 16, 1)
    assert pace.generation_s == pytest.approx(8.0) and pace.ratio == pytest.approx(4.0)
    assert "about 8 rollout(s) (now 2) would keep the learner busy" in pace.line()
    assert "learner idle 75%" in pace.line()


def test_pace_names_a_push_that_costs_more_than_a_tenth_of_an_update():
    line = Pace("m", generation_s=1.0, update_s=2.0, push_s=0.5, idle=0.0, rollouts=1, max_staleness=1).line()
    assert "the push takes 25% of an update: more rollout.prompts_per_step would spread it" in line


def test_no_pace_without_a_second_learner_step_or_a_busy_rollout():
    assert pace_of("m", _learner("m", [60.0]), [_rollout([0.5] * 3, [1.0] * 3)], 8, 1) is None
    assert pace_of("m", _learner("m", [60.0, 20.0]), [_rollout([0.0] * 3, [0.0] * 3)], 8, 1) is None
    assert pace_of("m", _learner("m", [60.0, 20.0]), [], 8, 1) is None


def test_pace_scalars_name_the_model():
    pace = Pace("m", generation_s=3.0, update_s=12.0, push_s=0.1, idle=0.05, rollouts=1, max_staleness=1)
    assert pace.scalars() == {"pace/m/generation_seconds": 3.0, "pace/m/update_seconds": 12.0,
                              "pace/m/generation_update_ratio": 0.25, "pace/m/learner_idle": 0.05}
