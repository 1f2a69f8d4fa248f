"""A model's learner as 2 FSDP2 ranks (CPU, gloo) takes the same update as 1 process on the same batch.

The two ranks are spawned processes joined on 127.0.0.1 at a free port through the torchrun environment
variables (what `init_ranks` reads); they are killed if they outlive the deadline. One update is two
AdamW steps (the second needs the no-grad proximal pass) over 6 samples of mixed lengths in micro-batches
that leave one rank with fewer passes. Tolerance: the ranks sum float32 gradients in another order than one
process accumulates them, so values agree to float32 rounding, not bit for bit: gradient norm to 1e-5
relative (measured <= 4e-7), loss to 1e-6 absolute (its terms are O(1) and nearly cancel; measured
<= 1.4e-7), weights after the update (lr 1e-2, moved up to 2e-2) to 2e-6 absolute (measured <= 4.2e-7).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.learner.policy import PolicyTrainer
from drmas.learner.sharding import deal
from drmas.models import load_model
from test_policy import _samples

SPAWN_DEADLINE_S = 300.0
# (aggregation, micro_batch_size): micro-batches of 1 give the ranks uneven pass counts (idle passes)
SETTINGS = [("token-mean", 1), ("seq-mean-token-mean", 2)]
ADVANTAGES = np.array([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
# AdamW's first steps are ~lr * g / (|g| + eps): with the default eps (1e-8) an element whose gradient is
# rounding noise (attention key biases have an exact gradient of zero: softmax cancels a shift shared by all
# scores) steps by up to lr either way, differently per summation order (measured: 1.2e-5 apart after two
# steps), and weights would compare the optimizer's conditioning, not the gradients. eps 1e-3 keeps small
# gradients in the linear regime (the first step's loss and gradient norm do not depend on it).
ADAM_EPS = 1e-3


def _trainer(model_dir: Path, aggregation: str, micro: int, ranks=None) -> PolicyTrainer:
    model, _ = load_model(model_dir)
    alg = AlgorithmConfig(micro_batch_size=micro, optim_steps_per_update=2, aggregation=aggregation)
    return PolicyTrainer("m", model, OptimConfig(lr=1e-2, eps=ADAM_EPS), alg, ranks=ranks)


def _update(trainer: PolicyTrainer, samples) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    metrics = trainer.update(samples, ADVANTAGES, version=0)
    return metrics, {name: t.clone() for name, t in trainer.named_tensors()}


def _rank_main(rank: int, size: int, port: int, model_dir: str, samples, out: str) -> None:
    """One rank: join the group as torchrun would, take the updates, rank 0 saves what it saw."""
    import torch.distributed as dist

    from drmas.learner.sharding import ShardedRanks, init_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    torch.set_num_threads(1)
    init_ranks("cpu")
    try:
        results = {}
        for aggregation, micro in SETTINGS:
            trainer = _trainer(Path(model_dir), aggregation, micro, ShardedRanks(torch.device("cpu")))
            results[aggregation] = _update(trainer, samples)
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def _spawn_ranks(size: int, *args) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = torch.multiprocessing.start_processes(_rank_main, args=(size, port, *args), nprocs=size, join=False,
                                                start_method="spawn")
    deadline = time.monotonic() + SPAWN_DEADLINE_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{size} ranks still running after {SPAWN_DEADLINE_S:.0f} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join()


def test_two_sharded_ranks_take_the_one_process_update(tiny_model_dir, tmp_path):
    samples = _samples(tiny_model_dir, n=6)
    for i, sample in enumerate(samples):  # mixed lengths: token-mean and sequence means then differ
        keep = max(len(sample.response_ids) - i, 2)
        sample.response_ids, sample.behaviour_logprobs = sample.response_ids[:keep], sample.behaviour_logprobs[:keep]
    out = tmp_path / "ranks.pt"
    _spawn_ranks(2, str(tiny_model_dir), samples, str(out))
    sharded = torch.load(out)
    initial, _ = load_model(tiny_model_dir)
    for aggregation, micro in SETTINGS:
        one, weights_one = _update(_trainer(tiny_model_dir, aggregation, micro), samples)
        two, weights_two = sharded[aggregation]
        diffs = {k: float((weights_two[k] - weights_one[k]).abs().max()) for k in weights_one}
        worst = max(diffs, key=diffs.get)
        moved = max(float((weights_one[k] - v.detach()).abs().max()) for k, v in initial.named_parameters())
        print(f"{aggregation}: loss {one['loss/m']:.9g} vs {two['loss/m']:.9g}, grad norm {one['grad_norm/m']:.9g} "
              f"vs {two['grad_norm/m']:.9g}, max weight diff {diffs[worst]:.3g} at {worst} (moved up to {moved:.3g})")
        assert one["grad_norm/m"] > 0 and moved > 1e-3
        assert weights_two.keys() == weights_one.keys()
        assert diffs[worst] <= 2e-6, (aggregation, worst, diffs[worst])
        assert two["loss/m"] == pytest.approx(one["loss/m"], abs=1e-6)
        for key in ("grad_norm/m", "grad_norm/m/max"):
            assert two[key] == pytest.approx(one[key], rel=1e-5), key
        for key in ("mismatch_kl/m", "ess/m", "clip_fraction/m", "tokens/m"):
            assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-7), key


def test_shares_partition_each_pass_and_balance_tokens():
    lengths = [50, 10, 40, 20, 30, 5, 45]
    indices = np.arange(len(lengths))
    shares = [deal(indices, lengths, rank, 3) for rank in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == indices.tolist()
    tokens = [sum(lengths[i] for i in share) for share in shares]
    assert max(tokens) - min(tokens) <= max(lengths)
    assert deal(np.array([4]), lengths, 1, 2).size == 0  # a rank may get nothing (it then runs idle passes)
