"""A model's learner as 2 FSDP2 ranks (CPU, gloo) takes the same update as 1 process on the same batch;
its distributed checkpoint resumes on 2 ranks and on 1 (and one of 1 process on 2); a failed update of one
rank reaches rank 0 with the failing rank and its reason.

The two ranks are spawned processes joined on 127.0.0.1 at a free port through the torchrun environment
variables (what `init_ranks` reads); they are killed if they outlive the deadline. One update is two
AdamW steps (the second needs the no-grad proximal pass) over 6 samples of mixed lengths in micro-batches
that leave one rank with fewer passes. Tolerance: the ranks sum float32 gradients in another order than one
process accumulates them, so values agree to float32 rounding, not bit for bit: gradient norm to 1e-5
relative (measured <= 4e-7), loss to 1e-6 absolute (its terms are O(1) and nearly cancel; measured
<= 1.4e-7), weights after the update (lr 1e-2, moved up to 2e-2) to 2e-6 absolute (measured <= 4.2e-7).

Checkpoints: the two ranks (rank 0 giving the orders a learner gives, rank 1 following them as in a run)
write a checkpoint after one update, then take a second update (the uninterrupted learner). Loading the
checkpoint restores weights and AdamW moments (exp_avg, exp_avg_sq, step) bit for bit, on 2 ranks, on 1
and (from a 1-process checkpoint) on 2: DCP stores the bytes and only reshards them. The second update
taken after resuming on 2 ranks equals the uninterrupted one bit for bit (same ranks, same summation
order); on 1 rank to the 2-vs-1 weight tolerance above (2e-6). All of it runs inside the one spawn of 2 ranks.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch
from test_policy import _samples
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from drmas.config.schema import AlgorithmConfig, OptimConfig
from drmas.learner.policy import PolicyTrainer
from drmas.learner.ranks.sharding import deal
from drmas.models import checkpoint
from drmas.models.loading import load_model, load_tokenizer

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


def _read_pass(source) -> dict[str, torch.Tensor]:
    """Every tensor of one pass of a weight source, in order, as a push reads them (copies kept)."""
    with source.open() as tensors:
        return {spec.name: tensors[i].clone() for i, spec in enumerate(source.specs())}


def _full_state(trainer: PolicyTrainer) -> dict:
    """Whole weights and AdamW moments by parameter name (a collective with N ranks; rank 0 gets them)."""
    model, optim = get_state_dict(trainer.model, trainer.optimizer,
                                  options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": {k: v.clone() for k, v in model.items()},
            "optim": {k: {n: v.clone() for n, v in state.items()} for k, state in optim.get("state", {}).items()}}


def _rank_main(rank: int, size: int, port: int, model_dir: str, samples, bad, out: str, ckpt_root: str,
               ckpt_of_one: str) -> None:
    """One rank: join the group as torchrun would, take the updates, write and resume a checkpoint, fail an
    update on rank 1; rank 0 saves what it saw."""
    import torch.distributed as dist

    from drmas.learner.ranks.group import BatchFanout, failure_reports, follow
    from drmas.learner.ranks.sharding import ShardedRanks, init_ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    torch.set_num_threads(1)
    init_ranks("cpu")

    def led(trainer: PolicyTrainer, orders) -> None:
        """Rank 1 follows rank 0's orders as in a run; rank 0 gives them and does its own part (`orders`)."""
        fanout = BatchFanout(trainer.ranks)
        if rank:
            follow(trainer, fanout)
            return
        orders(fanout)
        fanout.finish()

    results = {}
    try:
        for aggregation, micro in SETTINGS:
            trainer = _trainer(Path(model_dir), aggregation, micro, ShardedRanks(torch.device("cpu")))
            results[aggregation] = _update(trainer, samples)
            if aggregation == "token-mean":
                writer = trainer  # one update taken: checkpointed below
        results["written"] = _full_state(writer)

        def save_then_update(fanout: BatchFanout) -> None:  # LearnerWorker._save and _step on rank 0
            source = writer.weight_source(before_pass=fanout.gather)  # the HF directory: streamed, ordered
            results["checkpoint"] = fanout.save(writer, Path(ckpt_root), 1, source, load_tokenizer(Path(model_dir)),
                                                {"version": 1})
            fanout.send(samples, ADVANTAGES)
            writer.update(samples, ADVANTAGES, version=0)
            results["uninterrupted"] = _read_pass(source)  # as a push reads them: one ordered gather pass

        led(writer, save_then_update)
        resumed = _trainer(Path(model_dir), *SETTINGS[0], ShardedRanks(torch.device("cpu")))
        ckpt = checkpoint.checkpoint_dir(ckpt_root, 1)

        def resume(fanout: BatchFanout) -> None:  # what LearnerWorker._resume does on rank 0
            fanout.resume(resumed, ckpt, 1)

        led(resumed, resume)
        results["resumed"] = _full_state(resumed)
        results["resumed_update"] = _update(resumed, samples)[1]
        from_one = _trainer(Path(model_dir), *SETTINGS[0], ShardedRanks(torch.device("cpu")))
        checkpoint.load_trainer(checkpoint.checkpoint_dir(ckpt_of_one, 1), "m", from_one)
        results["from_one"] = _full_state(from_one)

        fanout = BatchFanout(resumed.ranks)
        if rank:
            try:
                follow(resumed, fanout)
            except IndexError:
                pass  # reported to rank 0 by follow(); this rank then ends, as torchrun would end it
            return
        fanout.send(bad, ADVANTAGES[:4])
        try:
            resumed.update(bad, ADVANTAGES[:4])
        except RuntimeError as exc:  # rank 1 left the update's collectives (gloo: connection closed)
            results["failure"] = (repr(exc), failure_reports(size))
        torch.save(results, out)
    finally:
        if "failure" not in results:
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


def _bad_on_rank_1(samples) -> list:
    """4 samples whose update fails on rank 1 only: of the second optimizer step's two samples (whose
    proximal pass comes first) rank 1 gets the shorter, and its token ids lie outside the vocabulary."""
    bad = [msgspec.structs.replace(s) for s in samples[:4]]
    assert len(bad[3].prompt_ids) + len(bad[3].response_ids) < len(bad[2].prompt_ids) + len(bad[2].response_ids)
    bad[3].response_ids = np.full(len(bad[3].response_ids), 10**6, dtype=np.int32)
    return bad


def _assert_equal_states(got: dict, want: dict, what: str) -> None:
    assert got["model"].keys() == want["model"].keys() and got["optim"].keys() == want["optim"].keys(), what
    assert all(torch.equal(got["model"][k], v) for k, v in want["model"].items()), what
    for name, state in want["optim"].items():
        assert state.keys() == {"step", "exp_avg", "exp_avg_sq"}, (what, name)
        assert all(torch.equal(got["optim"][name][k], v) for k, v in state.items()), (what, name)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.e2e
def test_two_sharded_ranks_take_the_one_process_update_and_resume_checkpoints(tiny_model_dir, tmp_path):
    samples = _samples(tiny_model_dir, n=6)
    for i, sample in enumerate(samples):  # mixed lengths: token-mean and sequence means then differ
        keep = max(len(sample.response_ids) - i, 2)
        sample.response_ids, sample.behaviour_logprobs = sample.response_ids[:keep], sample.behaviour_logprobs[:keep]
    ones = {}
    for aggregation, micro in SETTINGS:
        trainer = _trainer(tiny_model_dir, aggregation, micro)
        ones[aggregation] = _update(trainer, samples)
        if aggregation == "token-mean":  # a checkpoint of 1 process, which 2 ranks resume
            checkpoint.save_checkpoint(tmp_path / "one", 1, {}, {"m": trainer.state_dict()}, {"version": 1})
            written_by_one = _full_state(trainer)
    out = tmp_path / "ranks.pt"
    _spawn_ranks(2, str(tiny_model_dir), samples, _bad_on_rank_1(samples), str(out), str(tmp_path / "two"),
                 str(tmp_path / "one"))
    sharded = torch.load(out, weights_only=False)
    initial, _ = load_model(tiny_model_dir)
    for aggregation, micro in SETTINGS:
        one, weights_one = ones[aggregation]
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

    # the checkpoint of 2 ranks: written once (COMPLETE), resumed on 2 ranks, then on 1 process here
    written, ckpt = sharded["written"], sharded["checkpoint"]
    assert checkpoint.latest_checkpoint(tmp_path / "two") == ckpt
    assert all(float(s["step"]) == 2.0 for s in written["optim"].values())  # two AdamW steps per update
    _assert_equal_states(sharded["resumed"], written, "2 -> 2")
    uninterrupted = sharded["uninterrupted"]
    assert _max_diff(uninterrupted, sharded[SETTINGS[0][0]][1]) > 1e-3  # the second update moved the weights
    assert _max_diff(sharded["resumed_update"], uninterrupted) == 0.0
    single = _trainer(tiny_model_dir, *SETTINGS[0])
    checkpoint.load_trainer(ckpt, "m", single)
    _assert_equal_states(_full_state(single), written, "2 -> 1")
    diff = _max_diff(_update(single, samples)[1], uninterrupted)
    print(f"update after resuming on 1 rank vs the uninterrupted 2 ranks: max weight diff {diff:.3g}")
    assert diff <= 2e-6
    _assert_equal_states(sharded["from_one"], written_by_one, "1 -> 2")
    # rank 0's HF directory: transformers loads the writer's weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(ckpt / "m")
    assert type(hf).__name__ == "Qwen2ForCausalLM"
    assert all(torch.equal(p.detach(), written["model"][k]) for k, p in hf.named_parameters())

    # rank 1's update failed: rank 0's collective broke, and rank 1 told it why
    error, reports = sharded["failure"]
    print(f"rank 0 saw {error}; reports {reports}")
    assert list(reports) == [1] and reports[1].startswith("IndexError: index out of range"), reports


def test_shares_partition_each_pass_and_balance_tokens():
    lengths = [50, 10, 40, 20, 30, 5, 45]
    indices = np.arange(len(lengths))
    shares = [deal(indices, lengths, rank, 3) for rank in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == indices.tolist()
    tokens = [sum(lengths[i] for i in share) for share in shares]
    assert max(tokens) - min(tokens) <= max(lengths)
    assert deal(np.array([4]), lengths, 1, 2).size == 0  # a rank may get nothing (it then runs idle passes)
