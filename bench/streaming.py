"""Benchmark: multi-turn episodes/s with request-level streaming vs a per-round barrier, same engine.

    .venv/bin/python bench/streaming.py [--config configs/smoke.yaml] [--episodes 64] [--reps 3] [key=value ...]

A multi-agent episode is several LLM calls in a row (math: solver, verifier, maybe solver again), of
different lengths. With a barrier, every round waits for the slowest call of all episodes before any
episode's next turn starts; streaming hands each episode's next turn to the engine the moment its previous
one returns, which an engine with continuous batching (vLLM) runs alongside the others. Both modes run the
same episodes with the same per-call seeds in this run (one warm-up each, then alternating repetitions) and
the median wall time gives episodes/s; the ratio is streaming / barrier. `rollout.engine` picks the engine
(default here: vllm); with the embedded engine the two modes do the same work, as expected.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas import assembly  # noqa: E402
from drmas.config import read_config  # noqa: E402
from drmas.episodes import EpisodeRequest, EpisodeRunner  # noqa: E402
from drmas.tasks.sampler import ProblemSampler  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke.yaml")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per run (groups of rollout.group_size)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    cfg = read_config(args.config, ["rollout.engine=vllm", "system.max_rounds=2", *args.overrides])
    task = assembly.build_task(cfg)
    engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), cfg.trainer.seed) for m in cfg.models}
    group = cfg.rollout.group_size
    problems = ProblemSampler(task.split("train"), seed=0).next(max(1, args.episodes // group))
    requests = [EpisodeRequest(f"g{g}-e{i}", f"g{g}", problem) for g, problem in enumerate(problems)
                for i in range(group)]
    runners = {
        mode: EpisodeRunner(assembly.build_orchestra(cfg, task), engines, assembly.agent_specs(cfg),
                            cfg.algorithm.invalid_penalty, seed=cfg.trainer.seed, barrier=mode == "barrier")
        for mode in ("streaming", "barrier")
    }
    calls, lengths = {}, {}
    for mode, runner in runners.items():  # warm-up
        results = runner.run(requests)
        calls[mode] = sum(len(r.samples) for r in results)
        lengths = {agent: [len(s.response_ids) for r in results for s in r.samples if s.agent == agent]
                   for agent in cfg.agents}
    times: dict[str, list[float]] = {mode: [] for mode in runners}
    for _ in range(args.reps):
        for mode, runner in runners.items():
            start = time.perf_counter()
            runner.run(requests)
            times[mode].append(time.perf_counter() - start)
    rates = {mode: len(requests) / statistics.median(t) for mode, t in times.items()}
    print(f"engine={cfg.rollout.engine} episodes={len(requests)} max_rounds={cfg.system.max_rounds} "
          f"max_new_tokens={cfg.rollout.max_new_tokens} calls/episode={calls['streaming'] / len(requests):.2f}")
    for agent, counts in lengths.items():
        if counts:
            print(f"  {agent}: {len(counts)} calls, response tokens mean {statistics.mean(counts):.1f} "
                  f"min {min(counts)} max {max(counts)}")
    for mode, rate in rates.items():
        print(f"{mode:10s} {rate:8.2f} episodes/s  (median {statistics.median(times[mode]):.2f} s)")
    print(f"streaming/barrier = {rates['streaming'] / rates['barrier']:.2f}x")


if __name__ == "__main__":
    main()
