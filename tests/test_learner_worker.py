"""The async learner loop in this process against a real buffer: scripted episodes in, what it logs out.

The learner (`LearnerWorker`) runs as `drmas-learner` would, on the tiny random model, with a
`TrajectoryBuffer` serving in a thread and a `BufferProducer` standing in for the rollout, so a step takes
well under a second and no child process is needed.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import pytest
from pipeline_harness import SMOKE, free_ports
from tb_events import tensorboard_scalars

from drmas.buffer import BufferConfig, BufferProducer, TrajectoryBuffer
from drmas.config import read_config
from drmas.core.sample import Sample
from drmas.runtime.process import StopFlag

AGENTS = ("solver", "verifier")


def _sample(group: str, episode: str, agent: str, turn: int, reward: float) -> Sample:
    return Sample(episode_id=episode, group_id=group, agent=agent, model="policy", turn=turn, prompt_ids=[5, 6, 7],
                  response_ids=[8, 9], behaviour_logprobs=[-2.0, -2.5], policy_version=0, temperature=1.0,
                  valid=True, reward=reward)


def _send_groups(producer: BufferProducer, n_groups: int, group_size: int) -> None:
    """Groups whose rewards vary within the group: the solver right in every other episode, the verifier
    only in the first, so the two agents' running statistics differ."""
    for g in range(n_groups):
        group = f"g{g}"
        for e in range(group_size):
            episode = f"{group}-e{e}"
            rewards = (float(e % 2 == 0), float(e == 0))
            samples = [_sample(group, episode, agent, turn, r) for turn, (agent, r) in enumerate(zip(AGENTS, rewards))]
            producer.send_episode(group, group_size, episode, samples)
    producer.flush(timeout_s=10)


@pytest.fixture
def restore_logging():
    """LearnerWorker adds a log file and an excepthook to its process (meant for a process of its own)."""
    handlers, hook = list(logging.getLogger().handlers), sys.excepthook
    yield
    for handler in logging.getLogger().handlers:
        if handler not in handlers:
            logging.getLogger().removeHandler(handler)
            handler.close()
    sys.excepthook = hook


def test_the_learner_logs_running_reward_statistics_to_tensorboard_and_at_the_end(
        tmp_path: Path, tiny_model_dir, restore_logging, caplog):
    from drmas.learner.worker import LearnerWorker

    producer_port, consumer_port, weights_port = free_ports(3)
    steps, group_size = 2, 4
    cfg = read_config(SMOKE, [
        f"trainer.output_dir={tmp_path / 'run'}", f"trainer.steps={steps}", "trainer.threads=1",
        "logging.tensorboard=true", "models.policy.tiny.prime_steps=0", "rollout.prompts_per_step=1",
        f"rollout.group_size={group_size}", f"pipeline.learner_ports={{policy: {weights_port}}}",
        f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{producer_port}",
        f"pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:{consumer_port}",
    ])
    buffer = TrajectoryBuffer(BufferConfig(producer_endpoint=cfg.pipeline.buffer.producer_endpoint,
                                           consumer_endpoint=cfg.pipeline.buffer.consumer_endpoint),
                              agent_models={a: "policy" for a in AGENTS}).start()
    producer = BufferProducer(buffer.producer_endpoint, "scripted", timeout_s=10)
    try:
        _send_groups(producer, steps, group_size)
        with caplog.at_level(logging.INFO, logger="drmas.learner.worker"):
            assert LearnerWorker(cfg, "policy", StopFlag(install=False)).run() == steps
    finally:
        producer.close()
        buffer.stop()

    scalars = tensorboard_scalars(tmp_path / "run" / "learner-policy" / "tensorboard")
    # after both steps each agent has 2 groups x 4 calls: the solver 1, 0, 1, 0 per group, the verifier 1, 0, 0, 0
    expected = {"solver": (0.5, math.sqrt(2 / 7)), "verifier": (0.25, math.sqrt(3 / 14))}
    for agent, (mean, std) in expected.items():
        counts = scalars[f"reward_stats/{agent}/count"]
        assert [step for step, _ in counts] == [1, 2] and [v for _, v in counts] == [4.0, 8.0]
        assert scalars[f"reward_stats/{agent}/mean"][-1][1] == pytest.approx(mean)
        assert scalars[f"reward_stats/{agent}/std"][-1][1] == pytest.approx(std, rel=1e-6)
    final = [r.getMessage() for r in caplog.records if "running reward statistics" in r.getMessage()]
    assert final and "solver: mean=0.500 std=0.535 count=8 | verifier: mean=0.250 std=0.463 count=8" in final[-1]


def test_a_learner_refuses_ranks_it_cannot_start_naming_the_key(tmp_path):
    from drmas.learner.worker import LearnerWorker

    cfg = read_config(SMOKE, ["pipeline.mode=async", "models.policy.ranks=2", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"models.policy.ranks=2"):
        LearnerWorker(cfg, "policy", StopFlag())
