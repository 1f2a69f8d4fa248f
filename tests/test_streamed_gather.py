"""A learner of 2 FSDP2 ranks (CPU, gloo) serves real rollout processes and writes its HF checkpoint with its
weights gathered one parameter at a time as each pass reads them (`drmas.learner.ranks.gathered`), never the whole
model on rank 0.

One spawn of 2 ranks, a 6-layer Qwen2 with a small vocabulary (so no single parameter is a large share of
the model, as in a real LLM's layers), two rollouts (`weight_harness` receivers, digests of what they got):
- rollout a joins before any update: rank 0 serves the join sync from its own thread (`serve_joins`) and a
  gets the initial weights, bit-identical to the 1-process learner's;
- one update on both ranks, then a push: a gets version 1, bit-identical to what an ordered gather pass
  reads on rank 0, and that is the 1-process learner's update to float32 rounding (2e-6, as
  tests/test_sharding.py); the largest total of gathered bytes alive at once during the push is measured
  and must stay under a quarter of the model (measured: ~ the two largest parameters);
- rollout b joins between steps and gets version 1 (join sync from rank 0's thread again);
- the checkpoint's HF directory, written streamed into several safetensors files plus their index, loads
  in transformers and through `drmas.models.loading.load_model` with exactly those weights, and the DCP trainer
  state beside it loads into a 1-process trainer with the same weights.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from weight_harness import CFG, cluster, digests

from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.core.sample import Sample
from drmas.learner.policy import PolicyTrainer
from drmas.models import checkpoint
from drmas.models.loading import load_model, load_tokenizer

pytestmark = pytest.mark.timeout(240)

DEADLINE_S = 150.0
ADVANTAGES = np.array([1.0, -1.0, 0.5, -0.5])
SHARD_BYTES = 512 * 1024  # the HF directory's safetensors files are cut here: ~4 files for this model


def _layered_model(tmp: Path, tokenizer_dir: Path) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=256, num_hidden_layers=6,
                         num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                         tie_word_embeddings=True, dtype="float32")
    torch.manual_seed(0)
    out = tmp / "layered"
    Qwen2ForCausalLM(config).save_pretrained(out)
    load_tokenizer(tokenizer_dir).save_pretrained(out)  # a loadable directory; ids stay below 512 here
    return out


def _trainer(model_dir: Path, ranks=None) -> PolicyTrainer:
    model, _ = load_model(model_dir)
    return PolicyTrainer("m", model, OptimConfig(lr=1e-2, eps=1e-3), AlgorithmConfig(micro_batch_size=2),
                         ranks=ranks)


def _samples(trainer: PolicyTrainer) -> list[Sample]:
    rng = np.random.default_rng(0)
    samples = [Sample(episode_id=f"e{i}", group_id="g", agent="solver", model="m", turn=0,
                      prompt_ids=rng.integers(0, 512, 6 + i), response_ids=rng.integers(0, 512, 3 + i),
                      behaviour_logprobs=np.zeros(3 + i, np.float32), policy_version=0, temperature=1.0, valid=True)
               for i in range(4)]
    for sample, logprobs in zip(samples, trainer.logprobs(samples)):  # on-policy behaviour log-probs
        sample.behaviour_logprobs = logprobs.numpy()
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_until(sender, want: dict[str, int]) -> None:
    """What the learner does between steps and while it waits for a batch: serve join syncs itself."""
    deadline = time.monotonic() + 60
    while sender.receivers() != want:
        assert time.monotonic() < deadline, f"rollouts {sender.receivers()}, expected {want}"
        sender.serve_joins()
        time.sleep(0.05)


def _rank_main(rank: int, size: int, port: int, model_dir: str, samples, ports: tuple[int, int], out: str,
               ckpt_root: str) -> None:
    import torch.distributed as dist

    from drmas.config.weights import WeightSyncConfig
    from drmas.learner.ranks.group import BatchFanout, follow
    from drmas.learner.ranks.sharding import ShardedRanks, init_ranks
    from drmas.models import hf_streamed
    from drmas.weights import WeightSender

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    torch.set_num_threads(1)
    init_ranks("cpu")
    trainer = _trainer(Path(model_dir), ShardedRanks(torch.device("cpu")))
    fanout = BatchFanout(trainer.ranks)
    try:
        if rank:
            follow(trainer, fanout)
            return
        source = trainer.weight_source(before_pass=fanout.gather)
        version = 0
        sender = WeightSender("127.0.0.1", *ports, config=WeightSyncConfig(chunk_mb=0.01, **CFG),
                              current_weights=lambda: (version, source), joins_in_thread=source.concurrent)
        with sender:
            _serve_until(sender, {"a": 0})
            fanout.send(samples, ADVANTAGES)
            with sender.exclusive():
                trainer.update(samples, ADVANTAGES, version=0)
                version = 1
                report = sender.push(source, version)
            push_peak = source.peak_bytes
            _serve_until(sender, {"a": 1, "b": 1})
            with source.open() as tensors:  # one more ordered pass: the reference for what the rollouts got
                weights = {spec.name: tensors[i].clone() for i, spec in enumerate(source.specs())}
            hf_streamed.MAX_SHARD_BYTES = SHARD_BYTES
            ckpt = fanout.save(trainer, Path(ckpt_root), version, source, load_tokenizer(Path(model_dir)),
                               {"version": version})
            fanout.finish()
        torch.save({"report": report, "push_peak": push_peak, "model_bytes": source.model_bytes(),
                    "largest": max(s.nbytes for s in source.specs()), "weights": weights, "ckpt": ckpt}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.e2e
def test_two_sharded_ranks_stream_pushes_join_syncs_and_the_hf_checkpoint(tiny_model_dir, tmp_path):
    model_dir = _layered_model(tmp_path, tiny_model_dir)
    one = _trainer(model_dir)
    initial = {name: p.detach().clone() for name, p in one.model.named_parameters()}
    samples = _samples(one)
    one.update(samples, ADVANTAGES, version=0)
    updated = {name: p.detach().clone() for name, p in one.model.named_parameters()}

    ports = (_free_port(), _free_port())
    endpoint = f"tcp://127.0.0.1:{ports[0]}"
    out = tmp_path / "rank0.pt"
    ctx = torch.multiprocessing.start_processes(
        _rank_main, args=(2, _free_port(), str(model_dir), samples, ports, str(out), str(tmp_path / "run")),
        nprocs=2, join=False, start_method="spawn")
    try:
        with cluster() as c:
            c.receiver(endpoint, "a")
            assert c.wait_for({"a": 0}, timeout=90)["a"] == digests(initial)  # bit-identical to 1 process
            got_a = c.wait_for({"a": 1}, timeout=60)["a"]
            c.receiver(endpoint, "b")  # joins between steps
            got_b = c.wait_for({"b": 1}, timeout=60)["b"]
            deadline = time.monotonic() + DEADLINE_S
            while not ctx.join(timeout=1.0):
                assert time.monotonic() < deadline, "the ranks did not finish"
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join()
    result = torch.load(out, weights_only=False)
    weights, report = result["weights"], result["report"]
    assert report.receivers_ok == ["a"] and report.learner_sends == 1, report
    assert got_a == got_b == digests(weights)  # what the rollouts got is what rank 0's gather reads, bit for bit
    worst = max(float((weights[k] - updated[k]).abs().max()) for k in updated)
    moved = max(float((updated[k] - initial[k]).abs().max()) for k in updated)
    print(f"2 ranks vs 1 process after the update: max weight diff {worst:.3g} (moved up to {moved:.3g}); push: "
          f"gathered bytes alive at most {result['push_peak']} of a {result['model_bytes']}-byte model "
          f"(largest parameter {result['largest']})")
    assert weights.keys() == updated.keys() and worst <= 2e-6 and moved > 1e-3
    assert result["largest"] <= result["push_peak"] <= 3 * result["largest"]
    assert result["push_peak"] < result["model_bytes"] / 4

    hf_dir = result["ckpt"] / "m"
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1 and index["weight_map"].keys() == weights.keys()
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir)
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    assert all(torch.equal(p.detach(), weights[k]) for k, p in hf.named_parameters())
    loaded, _ = load_model(hf_dir)
    assert torch.equal(loaded.lm_head.weight, weights["model.embed_tokens.weight"])  # tied again on load
    resumed = _trainer(model_dir)
    checkpoint.load_trainer(result["ckpt"], "m", resumed)
    assert all(torch.equal(p.detach(), weights[k]) for k, p in resumed.model.named_parameters())


def test_streamed_safetensors_are_what_the_safetensors_library_reads(tmp_path):
    """Every dtype, a scalar, an empty tensor; a tied name written once; files cut at the shard size."""
    from safetensors.torch import load_file
    from weight_harness import make_weights

    from drmas.models.hf_streamed import write_safetensors
    from drmas.weights import NamedTensors

    weights = make_weights(3, layers=3)  # 256 KiB each: a file apiece at a 300 kB cut
    files = write_safetensors(NamedTensors(list(weights.items())), tmp_path, max_shard_bytes=300_000)
    read = {name: t for path in files for name, t in load_file(path).items()}
    assert len(files) == 4 and "lm_head.weight" not in read  # the alias of embed.weight
    assert read.keys() == weights.keys() - {"lm_head.weight"}
    assert all(torch.equal(read[k], weights[k]) and read[k].dtype == weights[k].dtype for k in read)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in read.values())
