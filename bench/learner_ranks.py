"""Benchmark: learner tokens/s with 1 rank against N FSDP2 ranks on the same global batch.

Run on demand (not part of the tests):

    .venv/bin/python bench/learner_ranks.py [--model tiny|smollm2] [--ranks 2] [--threads 2] [--reps 3]

Both sides take the same `PolicyTrainer.update` on the same global batch (`--groups` GRPO groups built as in
`bench/learner.py`, advantages computed once): 1 process with `--threads` intra-op threads, against `--ranks`
spawned ranks (gloo on CPU, the torchrun environment a learner of `models.<id>.ranks` gets) with
`--threads / --ranks` threads each, so both use the same cores. Each rank deals itself its share of the batch
and sums gradients with the others (`drmas.learner.ranks.sharding`). One warm-up update, then the median of
`--reps`; printed as `ranks{N}/ranks1 = X.XXx` (tokens/s). On a CPU box of 2 cores expect little or a loss:
the ranks add all-gathers and reduce-scatters and split the same cores; the gain comes from more devices.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learner import make_batch_frames  # noqa: E402  (bench/learner.py: the same batch)

from drmas.buffer.framing import decode_client_reply, open_group  # noqa: E402
from drmas.config.schema import AlgorithmConfig, OptimConfig, TinyModelConfig  # noqa: E402
from drmas.learner.batch import group_advantages  # noqa: E402
from drmas.algorithms.running_stats import AgentRewardStats  # noqa: E402
from drmas.models.loading import build_tiny_model, import_smollm2, load_model  # noqa: E402


def _rank_main(rank: int, size: int, port: int, model_dir: str, data: list[bytes], micro: int, threads: int, reps: int,
               out: str) -> None:
    from drmas.learner.policy import PolicyTrainer
    from drmas.learner.ranks.sharding import ShardedRanks, init_ranks
    from drmas.learner.ranks.single import SingleRank

    torch.set_num_threads(threads)
    if size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
        init_ranks("cpu")
        ranks = ShardedRanks(torch.device("cpu"))
    else:
        ranks = SingleRank()
    alg = AlgorithmConfig(micro_batch_size=micro, optim_steps_per_update=1)
    groups = [open_group(view) for view in decode_client_reply(data).groups]
    samples, advantages = group_advantages(groups, alg, AgentRewardStats())
    model, _ = load_model(Path(model_dir))
    trainer = PolicyTrainer("m", model, OptimConfig(lr=1e-6), alg, ranks=ranks)
    trainer.update(samples, advantages)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        trainer.update(samples, advantages)
        times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(str(statistics.median(times)))
    if size > 1:
        torch.distributed.destroy_process_group()


def run_ranks(size: int, model_dir: Path, data: list[bytes], args) -> float:
    """Median seconds of one update with `size` ranks (spawned processes, killed if they outlive 30 min)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "median")
        threads = max(1, args.threads // size)
        ctx = torch.multiprocessing.start_processes(
            _rank_main, args=(size, port, str(model_dir), data, args.micro_batch, threads, args.reps, out),
            nprocs=size, join=False, start_method="spawn")
        deadline = time.monotonic() + 1800
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{size} ranks still running after 30 min")
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        return float(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads in all, split over the ranks")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups in the global batch")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=192, help="longest prompt (tokens); rows take 75-100%%")
    parser.add_argument("--response", type=int, default=64, help="longest response (tokens); rows take 50-100%%")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    model_dir = import_smollm2() if args.model == "smollm2" else build_tiny_model(TinyModelConfig())
    model, _ = load_model(model_dir)
    torch.manual_seed(0)
    data = make_batch_frames(model, args)
    samples = [s for view in decode_client_reply(data).groups for s in open_group(view).samples]
    tokens = sum(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    seconds = {size: run_ranks(size, model_dir, data, args) for size in (1, args.ranks)}
    print(f"[{args.model}: {len(samples)} samples, {tokens} tokens an update, micro-batch {args.micro_batch}, "
          f"{args.threads} threads in all, median of {args.reps}]")
    for size, sec in seconds.items():
        print(f"{size} rank(s): {tokens / sec:10.0f} tokens/s ({1000 * sec:.1f} ms an update)")
    print(f"ranks{args.ranks}/ranks1 = {seconds[1] / seconds[args.ranks]:.2f}x  ({args.model})", flush=True)


if __name__ == "__main__":
    main()
