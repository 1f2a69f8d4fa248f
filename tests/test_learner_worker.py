"""The async learner loop in this process against a real buffer: scripted episodes in, what it logs out.

The learner (`LearnerWorker`) runs as `drmas-learner` would, on the tiny random model, with a
`TrajectoryBuffer` serving in a thread and a `BufferProducer` standing in for the rollout, so a step takes
well under a second and no child process is needed.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path

import pytest
import torch
from pipeline_harness import SMOKE, free_ports
from tb_events import tensorboard_scalars

from drmas.buffer import BufferConfig, BufferProducer, TrajectoryBuffer
from drmas.config import read_config
from drmas.core.sample import Sample
from drmas.runtime.metrics import read_metrics
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
        with caplog.at_level(logging.INFO, logger="drmas.learner"):
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


# ---- one learner process for the adapters of a base: a lane per adapter ------------------------------------

LORA = Path(__file__).resolve().parents[1] / "configs" / "smoke_lora.yaml"
ADAPTERS = {"solver": "base/solver", "verifier": "base/verifier"}


def _lora_config(out: Path, steps: int, *extra: str):
    producer_port, consumer_port, *weights = free_ports(4)
    return read_config(LORA, [
        f"trainer.output_dir={out}", f"trainer.steps={steps}", "trainer.threads=1", "logging.tensorboard=false",
        "models.base.tiny.prime_steps=0", "rollout.prompts_per_step=1", "rollout.group_size=4",
        "trainer.checkpoint_interval=1",
        f"pipeline.learner_ports={{base/solver: {weights[0]}, base/verifier: {weights[1]}}}",
        f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{producer_port}",
        f"pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:{consumer_port}", *extra])


def _train_adapters(cfg, first_group: int, n_groups: int, version: int = 0) -> int:
    """`drmas-learner --model base` in this process against a real buffer fed `n_groups` scripted groups
    (made by weights of `version`) whose solver and verifier calls carry different tokens; returns the
    version reached."""
    from drmas.learner.worker import LearnerWorker

    buffer = TrajectoryBuffer(BufferConfig(producer_endpoint=cfg.pipeline.buffer.producer_endpoint,
                                           consumer_endpoint=cfg.pipeline.buffer.consumer_endpoint),
                              agent_models=ADAPTERS).start()
    producer = BufferProducer(buffer.producer_endpoint, "scripted", timeout_s=10)
    try:
        for g in range(first_group, first_group + n_groups):
            for e in range(4):
                samples = [Sample(episode_id=f"g{g}-e{e}", group_id=f"g{g}", agent=agent, model=model, turn=turn,
                                  prompt_ids=[5, 6, 7], response_ids=[8 + 10 * turn, 9 + 10 * turn],
                                  behaviour_logprobs=[-2.0, -2.5], policy_version=version, temperature=1.0, valid=True,
                                  reward=float((e + turn) % 2 == 0))
                           for turn, (agent, model) in enumerate(ADAPTERS.items())]
                producer.send_episode(f"g{g}", 4, f"g{g}-e{e}", samples)
        producer.flush(timeout_s=10)
        worker = LearnerWorker(cfg, "base", StopFlag(install=False))
        assert [lane.model_id for lane in worker.lanes] == list(ADAPTERS.values())
        assert worker.lanes[0].model is worker.lanes[1].model  # one copy of the base
        return worker.run()
    finally:
        producer.close()
        buffer.stop()


def test_one_learner_trains_each_adapter_on_its_own_agents_groups_and_resumes_each(tmp_path, restore_logging):
    from drmas.config.derived import learner_processes
    from drmas.models import checkpoint
    from drmas.runtime.metrics import read_metrics

    out = tmp_path / "run"
    cfg = _lora_config(out, 2)
    assert learner_processes(cfg) == {"base": list(ADAPTERS.values())}
    assert learner_processes(_lora_config(out, 2, "models.base.learner_per_adapter=true")) == {
        m: [m] for m in ADAPTERS.values()}
    assert _train_adapters(cfg, 0, 2) == 2
    assert (out / "learner-base" / "process.log").is_file()  # the process's log; each lane's files its own
    for agent, model in ADAPTERS.items():
        other = next(a for a in ADAPTERS if a != agent)
        rows = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2]
        for r in rows:  # each lane's updates took its own agent's calls only: 4 per group
            assert r[f"samples/{model}"] == 4 and f"reward/{agent}/mean" in r and f"reward/{other}/mean" not in r
            assert r[f"memory/{model}/peak_rss_mb"] > 0 and r[f"time/{model}/update_seconds"] > 0
        assert checkpoint.latest_checkpoint(out / f"learner-{model}").name == "step_2"

    # the adapters' weights after the first run, then a resumed run of one more step each
    from safetensors.torch import load_file

    def adapter_weights(model: str, step: int) -> dict:
        path = out / f"learner-{model}" / "checkpoints" / f"step_{step}" / model / "adapter_model.safetensors"
        return load_file(path)

    cfg = _lora_config(out, 3, "trainer.resume=true")
    assert _train_adapters(cfg, 2, 1, version=2) == 3
    for agent, model in ADAPTERS.items():
        rows = read_metrics(out / f"learner-{model}" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3]  # went on from its own checkpoint at step 2
        before, after = adapter_weights(model, 2), adapter_weights(model, 3)
        assert before.keys() == after.keys() and any(not (before[k] == after[k]).all() for k in before)


# ---- the weight push on a thread of its own (pipeline.weights.background) ----------------------------------

def test_a_background_push_sends_each_version_as_trained_and_the_buffer_hears_of_it_only_after_the_rollout(
        tmp_path: Path, tiny_model_dir, restore_logging):
    """A slow rollout (its apply takes 0.3 s) makes every push outlast the learner's next forward and backward
    pass, so the next optimizer step would change the weights under a push that did not wait for it. Each
    version the rollout gets must equal that version's checkpoint, and while it applies version v the buffer
    must still be at v - 1 (admission trusts that rollouts hold the version reported)."""
    import threading

    from safetensors.torch import load_file

    from drmas.learner.worker import LearnerWorker
    from drmas.weights import WeightReceiver

    producer_port, consumer_port, weights_port = free_ports(3)
    steps, group_size = 3, 4
    out = tmp_path / "run"
    cfg = read_config(SMOKE, [
        f"trainer.output_dir={out}", f"trainer.steps={steps}", "trainer.threads=1", "trainer.checkpoint_interval=1",
        "logging.tensorboard=true", "models.policy.tiny.prime_steps=0", "models.policy.optim.lr=0.01",
        "rollout.prompts_per_step=1", f"rollout.group_size={group_size}", "pipeline.max_staleness=3",
        f"pipeline.learner_ports={{policy: {weights_port}}}",
        f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{producer_port}",
        f"pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:{consumer_port}",
    ])
    assert cfg.pipeline.weights.background
    buffer = TrajectoryBuffer(BufferConfig(producer_endpoint=cfg.pipeline.buffer.producer_endpoint,
                                           consumer_endpoint=cfg.pipeline.buffer.consumer_endpoint),
                              agent_models={a: "policy" for a in AGENTS}).start()
    producer = BufferProducer(buffer.producer_endpoint, "scripted", timeout_s=10)
    asker = BufferProducer(buffer.producer_endpoint, "asker", timeout_s=10)  # used by the rollout's apply only
    received: dict[int, dict] = {}
    buffer_at: dict[int, int] = {}
    applied_at: dict[int, float] = {}

    def apply(named, version: int, incarnation: str) -> None:
        received[version] = {name: tensor.clone() for name, tensor in named}
        asker.request_admission(0)
        buffer_at[version] = asker.learner_versions.get("policy", 0)
        time.sleep(0.3)
        applied_at[version] = time.time()

    receiver = WeightReceiver(f"tcp://127.0.0.1:{weights_port}", "r0", apply, model="policy", background=True)
    worker = LearnerWorker(cfg, "policy", StopFlag(install=False))
    result: list = []
    learner = threading.Thread(target=lambda: result.append(worker.run()))
    try:
        learner.start()
        receiver.start()
        deadline = time.monotonic() + 60
        while receiver.version is None:  # joined, and given version 0: every push below reaches it
            assert time.monotonic() < deadline and learner.is_alive(), "the rollout never got version 0"
            time.sleep(0.05)
        _send_groups(producer, steps, group_size)
        learner.join(timeout=120)
        assert not learner.is_alive() and result == [steps]
    finally:
        receiver.close()
        producer.close()
        asker.close()
        buffer.stop()
        learner.join(timeout=30)

    assert sorted(received) == list(range(steps + 1))
    for version in range(1, steps + 1):
        assert buffer_at[version] == version - 1
        saved = load_file(out / "learner-policy" / "checkpoints" / f"step_{version}" / "policy" / "model.safetensors")
        common = sorted(set(saved) & set(received[version]))
        assert len(common) >= len(received[version]) - 1  # a tied head is sent once, saved under the other name
        for name in common:
            assert torch.equal(received[version][name], saved[name]), (version, name)
    assert any(not torch.equal(received[1][n], received[steps][n]) for n in received[1])  # the weights moved
    waits = tensorboard_scalars(out / "learner-policy" / "tensorboard")["weight_sync/policy/learner_wait_seconds"]
    assert [step for step, _ in waits] == list(range(1, steps + 1))
    # a step's record is written once its push ended, but stamped with the step's end (throughput is measured
    # between the stamps): before the rollout finished applying that version
    records = read_metrics(out / "learner-policy" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    assert all(r["time"] < applied_at[r["step"]] for r in records), (records, applied_at)
    assert all(r["weight_sync/policy/receivers"] == 1 for r in records)  # each step's figures: its own push
