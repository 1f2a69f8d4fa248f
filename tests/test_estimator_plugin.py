"""A plugin advantage estimator, examples/estimators/median_baseline.py's `agent_median`: loaded through the
config's `plugins`, its advantages on a hand-built batch, docs/extending.md's copy of it, and two colocated
steps of the smoke run trained with it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from drmas import assembly
from drmas.algorithms import ADVANTAGE_ESTIMATORS, AdvantageBatch, estimate
from drmas.algorithms.running_stats import AgentRewardStats
from drmas.colocated import ColocatedRun
from drmas.runtime.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "examples" / "estimators" / "median_baseline.py"
SMOKE = ROOT / "configs" / "smoke.yaml"


def _config(tmp_path: Path, *overrides: str):
    return assembly.load_config(SMOKE, [f"plugins=[{PLUGIN}]", "algorithm.estimator=agent_median",
                                        f"trainer.output_dir={tmp_path / 'run'}", "logging.tensorboard=false",
                                        *overrides])


def test_agent_median_is_reward_minus_the_median_of_the_agents_calls_in_the_group(tmp_path):
    alg = _config(tmp_path).algorithm  # imports the plugin, as every process does
    assert "agent_median" in ADVANTAGE_ESTIMATORS.names() and alg.chosen_estimator == "agent_median"
    rows = [  # (group, episode, agent, reward): rows of the two groups and agents interleaved
        ("g1", "e0", "solver", 1.0), ("g1", "e0", "verifier", 0.2), ("g2", "e0", "verifier", 0.0),
        ("g1", "e0", "solver", 0.5), ("g1", "e1", "solver", 0.0), ("g2", "e0", "solver", 0.6),
        ("g1", "e1", "verifier", 0.2), ("g1", "e2", "solver", 0.9), ("g2", "e1", "verifier", 1.0),
        ("g1", "e2", "verifier", 1.0),
    ]
    group, episode, agent, reward = (np.array(column) for column in zip(*rows))
    scores = {}
    for g, e, _, r in rows:
        scores.setdefault((g, e), []).append(r)
    batch = AdvantageBatch(
        reward=reward.astype(np.float64), group=group, episode=episode, agent=agent,
        turn=np.zeros(len(rows), dtype=np.int64),
        episode_scores={key: float(np.mean(r)) for key, r in scores.items()},
        group_rewards={g: reward[group == g].astype(np.float64) for g in ("g1", "g2")},
    )
    # g1 solver: 1.0, 0.5, 0.0, 0.9 (median 0.7); g1 verifier: 0.2, 0.2, 1.0 (median 0.2);
    # g2 verifier: 0.0, 1.0 (median 0.5); g2 solver: one call, 0
    expected = [0.3, 0.0, -0.5, -0.2, -0.7, 0.0, 0.0, 0.2, 0.5, 0.8]
    np.testing.assert_allclose(estimate(batch, alg, AgentRewardStats()), expected, rtol=0, atol=1e-12)


def test_docs_extending_shows_the_example_estimator_file():
    text = (ROOT / "docs" / "extending.md").read_text()
    (block,) = re.findall(r"<!-- example: examples/estimators/median_baseline.py -->\n```python\n(.*?)```", text,
                          re.DOTALL)
    assert block == PLUGIN.read_text()


@pytest.mark.e2e
def test_agent_median_trains_two_colocated_steps(tmp_path):
    """The smoke run's tiny model primed 100 steps instead of 200: building it is most of this test's time when
    it runs alone, and 100 steps already teach the formats, so rewards vary and a gradient flows."""
    cfg = _config(tmp_path, "trainer.steps=2", "eval.n_problems=0", "trainer.threads=1",
                  "models.policy.tiny.prime_steps=100")
    ColocatedRun(cfg, log=lambda *_: None).run()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    sq_means = [r[f"advantage/{name}/sq_mean"] for r in records for name in ("solver", "verifier")]
    assert all(math.isfinite(x) for x in sq_means) and max(sq_means) > 0, sq_means
    assert all(math.isfinite(r["loss/policy"]) for r in records) and max(r["grad_norm/policy"] for r in records) > 0
