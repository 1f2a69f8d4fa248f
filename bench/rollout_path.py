"""Where a rollout's time goes between engine output and the buffer's socket, over real episodes.

The real `EpisodeRunner` drives a config's episodes (default: the async smoke run's two tiny models) and
publishes each finished one through a real `BufferProducer` to a real `TrajectoryBuffer` (in a thread), as a
rollout process does. Wall-clock timers wrap what happens around generation: chat templating of each turn's
prompt (`drmas.episodes.submission.encode`), grading (`answers_match`), sample assembly (`episode_samples`) and
publishing (encode + send + acknowledgements). Each prints as a share of the whole stream; the rest is
generation and the orchestra's own logic. (cProfile is no use here: it inflates Python-heavy parts such as
the grader's sympy many times over.)

    python bench/rollout_path.py [--config configs/smoke_async.yaml] [--groups 16]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from drmas import assembly
from drmas.buffer import BufferConfig, BufferProducer, TrajectoryBuffer
from drmas.config.load import read_config
from drmas.episodes import EpisodeRequest, EpisodeRunner, isolation, submission
from drmas.tasks import grading
from drmas.tasks.sampler import ProblemSampler

spent: Counter[str] = Counter()


def timed(function, label: str):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke_async.yaml")
    parser.add_argument("--groups", type=int, default=16, help="GRPO groups to run (after one warm-up episode)")
    args = parser.parse_args()
    cfg = read_config(args.config)
    task = assembly.build_task(cfg)
    sampler = ProblemSampler(task.split("train"), seed=0)
    engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), 0)
               for m in sorted({a.model for a in cfg.agents.values()})}
    trained = assembly.trained_agent_models(cfg)
    runner = EpisodeRunner(assembly.build_orchestra(cfg, task), engines, assembly.agent_specs(cfg),
                           cfg.algorithm.invalid_penalty, seed=0)
    buffer = TrajectoryBuffer(BufferConfig(producer_endpoint="tcp://127.0.0.1:0",
                                           consumer_endpoint="tcp://127.0.0.1:0"), agent_models=trained).start()
    producer = BufferProducer(buffer.producer_endpoint, "bench", window=64)
    size, started, episodes = cfg.rollout.group_size, 0, 0

    def admit(live: int):
        nonlocal started
        if started >= args.groups:
            return None
        requests = []
        for problem in sampler.next(min(max(0, cfg.rollout.prompts_per_step - live // size), args.groups - started)):
            requests += [EpisodeRequest(f"g{started}-e{i}", f"g{started}", problem) for i in range(size)]
            started += 1
        return requests

    def publish(result) -> None:
        nonlocal episodes
        while producer.unacked >= producer.window:
            producer.flush()
        producer.send_episode(result.request.group_id, size, result.request.episode_id,
                              [s for s in result.samples if s.agent in trained],
                              [s.reward for s in result.samples if s.agent not in trained])
        episodes += 1

    try:
        runner.run([EpisodeRequest("warm-e0", "warm", sampler.next(1)[0])])  # first forward passes, imports
        submission.encode = timed(submission.encode, "chat templating")
        isolation.episode_samples = timed(isolation.episode_samples, "sample assembly")
        grading.answers_match = timed(grading.answers_match, "grading")
        start = time.perf_counter()
        runner.stream(admit, timed(publish, "publish to the socket"))
        producer.flush()
        wall = time.perf_counter() - start
    finally:
        producer.close()
        buffer.stop()
    print(f"[{args.config}: {episodes} episodes in {wall:.2f} s]")
    for label in ("chat templating", "grading", "sample assembly", "publish to the socket"):
        print(f"rollout/{label.replace(' ', '_')} = {100 * spent[label] / wall:.1f}% of the round "
              f"({spent[label]:.3f} s)")
    print(f"rollout/generation_and_orchestra = {100 * (1 - sum(spent.values()) / wall):.1f}%")


if __name__ == "__main__":
    main()
