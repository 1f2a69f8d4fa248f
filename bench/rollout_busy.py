"""How busy a rollout keeps its engines: rollout tokens/s against the engines' own capacity on the same work.

Two measurements per round, in one process, on the same engine objects and weights:

1. **rollout**: the real `EpisodeRunner.stream` (what `drmas-rollout` runs) over the config's orchestra,
   task and agents, with engines of `--batch` rows and as many episodes kept live as a rollout keeps
   (`groups_in_flight`: by default enough to fill every engine; `--live` overrides), a finished episode
   replaced at once, for `--seconds`; tokens are the response tokens of finished episodes, as
   the rollout's `throughput/rollout/tokens_per_s` counts them. Every request the engines got is recorded
   (prompt, sampling settings, seed, and the length of the response it produced);
2. **capacity**: the same requests replayed, per model, as one `generate` call on an engine over the same
   model object with a batch of `--batch` rows (EOS and stop strings off, each request capped at the length
   it had): the same prompts to prefill and the same tokens to make, with the batch full from the first
   step to the last. The difference is what the rollout loses by handing turns over one at a time (rows
   finishing at different steps, engines taking turns, admission).

Rates are per wall second and per CPU second of this process (on a machine shared with other work the
second is steadier, with `trainer.threads=1` most of all; nothing here waits on another process, so neither
hides idle time). The rounds are medians; the ratio rollout/capacity is the figure (goal >= 0.8). Beside it,
the batch occupancy of both phases: the mean number of rows per decode step (forward passes of one token
per row) over the engine's batch size, which does not depend on how busy the machine is; on a GPU, where a
decode step costs about the same for any number of rows, it bounds the rollout's rate. What it leaves out: the learners, the
buffer and the weight pushes (their waits are the pipeline's; `scripts/gpu_check.sh` reports the full
pipeline's figure beside this one).

    python bench/rollout_busy.py [--config configs/smoke_async.yaml] [--batch 32] [--live N] [--seconds 10] [overrides...]

With `--profile out.prof` the rollout phases run under cProfile and the top entries are printed.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas import assembly  # noqa: E402
from drmas.engines.base import request_level  # noqa: E402
from drmas.engines.embedded import EmbeddedEngine  # noqa: E402
from drmas.episodes import EpisodeRequest, EpisodeRunner  # noqa: E402
from drmas.rollout.worker import groups_in_flight  # noqa: E402
from drmas.tasks.sampler import ProblemSampler  # noqa: E402


class Clock:
    """Wall and CPU seconds of this process since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def seconds(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, max(time.process_time() - self.cpu, 1e-9)


class Occupancy:
    """Rows per decode step of a model's forward passes (a pre-hook counts them)."""

    def __init__(self, model) -> None:
        self.steps = self.rows = 0
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] == 1:
            self.steps += 1
            self.rows += ids.shape[0]

    def take(self) -> tuple[int, int]:
        taken, self.steps, self.rows = (self.steps, self.rows), 0, 0
        return taken


class Recorder:
    """Wraps an engine's request level: remembers every request and the length of its response."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.level = request_level(engine)
        self.requests: dict[str, tuple[list[int], object]] = {}
        self.done: list[tuple[list[int], object, int]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def submit(self, request_id, prompt, params) -> None:
        self.requests[request_id] = (prompt, params)
        self.level.submit(request_id, prompt, params)

    def in_progress(self) -> int:
        return self.level.in_progress()

    def abort(self, request_ids) -> None:
        self.level.abort(request_ids)

    def step(self):
        finished = self.level.step()
        for request_id, generation in finished:
            prompt, params = self.requests.pop(request_id)
            self.done.append((prompt, params, len(generation.token_ids)))
        return finished


def rollout(runner: EpisodeRunner, sampler: ProblemSampler, size: int, live_target: int, seconds: float,
            profiler: cProfile.Profile | None) -> tuple[int, tuple[float, float], int, float]:
    """(tokens, (wall s, CPU s), episodes, mean live episodes) of the episode runner kept at `live_target`
    live episodes for `seconds` (then the live ones finish, as a rollout's do when it stops admitting)."""
    state = {"started": 0, "tokens": 0, "episodes": 0, "live_sum": 0, "rounds": 0}
    deadline = time.perf_counter() + seconds

    def admit(live: int):
        if time.perf_counter() >= deadline:
            return None
        state["live_sum"] += live
        state["rounds"] += 1
        requests = []
        for problem in sampler.next(max(0, (live_target - live) // size)):
            group = f"g{state['started']}"
            state["started"] += 1
            requests += [EpisodeRequest(f"{group}-e{i}", group, problem) for i in range(size)]
        return requests

    def publish(result) -> None:
        state["tokens"] += sum(len(s.response_ids) for s in result.samples)
        state["episodes"] += 1

    clock = Clock()
    if profiler:
        profiler.enable()
    runner.stream(admit, publish)
    if profiler:
        profiler.disable()
    return state["tokens"], clock.seconds(), state["episodes"], state["live_sum"] / max(state["rounds"], 1)


def replay(recorders: dict[str, Recorder], batch: int) -> tuple[int, tuple[float, float]]:
    """(tokens, (wall s, CPU s)) of every recorded request generated again in full batches, per model."""
    tokens, wall, cpu = 0, 0.0, 0.0
    for recorder in recorders.values():
        done, recorder.done = recorder.done, []
        if not done:
            continue
        engine = recorder.engine
        full = EmbeddedEngine(engine.model_id, engine.model, engine.tokenizer, max_batch_size=batch, eos_token_ids=())
        params = [dataclasses.replace(p, stop=(), max_new_tokens=n) for _, p, n in done]
        clock = Clock()
        tokens += sum(len(g.token_ids) for g in full.generate([prompt for prompt, _, _ in done], params))
        seconds = clock.seconds()
        wall, cpu = wall + seconds[0], cpu + seconds[1]
    return tokens, (wall, cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/smoke_async.yaml")
    parser.add_argument("--batch", type=int, default=32, help="the engines' batch (rollout.max_batch_size)")
    parser.add_argument("--live", type=int, default=0, help="episodes kept live (0: as a rollout keeps them)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each rollout phase")
    parser.add_argument("--rounds", type=int, default=3, help="rollout / capacity rounds (medians taken)")
    parser.add_argument("--profile", default=None, help="write a cProfile of the rollout phases here")
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args()
    cfg = assembly.load_config(args.config, args.overrides)
    cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_batch_size=args.batch))
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    task = assembly.build_task(cfg)
    served = sorted({a.model for a in cfg.agents.values() if a.model})  # none: a scripted agent
    engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), 0) for m in served}
    if not all(isinstance(e, EmbeddedEngine) for e in engines.values()):
        raise SystemExit("bench/rollout_busy.py measures the embedded engine (rollout.engine=embedded)")
    recorders = {m: Recorder(e) for m, e in engines.items()}
    counters = [Occupancy(e.model) for e in engines.values()]

    def occupancy() -> float:
        steps, rows = (sum(c) for c in zip(*(counter.take() for counter in counters)))
        return rows / max(steps, 1) / args.batch
    runner = EpisodeRunner(assembly.build_orchestra(cfg, task), recorders, assembly.agent_specs(cfg),
                           cfg.algorithm.invalid_penalty, seed=0)
    sampler = ProblemSampler(task.split("train"), seed=0)
    runner.run([EpisodeRequest("warm-e0", "warm", sampler.next(1)[0])])  # first passes, imports
    replay(recorders, args.batch)
    occupancy()
    profiler = cProfile.Profile() if args.profile else None
    live_target = args.live or groups_in_flight(cfg, len(served)) * cfg.rollout.group_size
    rolls, caps, episodes, lives = [], [], 0, []
    for _ in range(args.rounds):
        tokens, (wall, cpu), n, live = rollout(runner, sampler, cfg.rollout.group_size, live_target, args.seconds,
                                               profiler)
        rolls.append((tokens / wall, tokens / cpu, occupancy()))
        episodes, lives = episodes + n, lives + [live]
        tokens, (wall, cpu) = replay(recorders, args.batch)
        caps.append((tokens / wall, tokens / cpu, occupancy()))
    if profiler:
        profiler.dump_stats(args.profile)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    device = next(engines[served[0]].model.parameters()).device
    print(f"config={args.config} batch={args.batch} live={live_target} device={device} "
          f"threads={torch.get_num_threads()} rounds={args.rounds} models={','.join(served)}")
    roll = [statistics.median(r[i] for r in rolls) for i in (0, 1, 2)]
    cap = [statistics.median(c[i] for c in caps) for i in (0, 1, 2)]
    print(f"rollout          {roll[0]:9.1f} tok/s wall  {roll[1]:9.1f} tok/CPU-s  occupancy {roll[2]:.2f}  "
          f"({episodes} episodes, {statistics.mean(lives):.1f} live on average)")
    print(f"engine capacity  {cap[0]:9.1f} tok/s wall  {cap[1]:9.1f} tok/CPU-s  occupancy {cap[2]:.2f}  (the same "
          f"requests in full batches of {args.batch})")
    print(f"ratio rollout/capacity = {roll[0] / cap[0]:.2f} (wall), {roll[1] / cap[1]:.2f} (CPU time)")


if __name__ == "__main__":
    main()
