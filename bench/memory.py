"""Benchmark: the learner's peak memory per phase on the quick starts, next to the floor its weights and
optimiser need (parameters x 16 bytes: float32 weights, gradients and AdamW's two moments).

Run on demand (not part of the tests; SmolLM2-135M, a few minutes per config on 2 cores):

    .venv/bin/python bench/memory.py [--configs quickstart search] [--updates 2] [--samples-dir runs/bench_memory]

Per config (configs/quickstart.yaml; configs/search_quickstart.yaml, whose prompts carry retrieved passages):

1. Real samples, recorded once: a child process plays `--updates` steps of the config's episodes (its task,
   system, retriever and agents, `rollout.prompts_per_step` x `rollout.group_size` episodes a step) on the
   real SmolLM2 with the config's engine, as a rollout does, and stores the samples in
   ``<samples-dir>/<config>.samples`` (reused by later runs: delete it to record again).
2. The learner, in a fresh child process (its memory is the learner's alone): its trainer built as
   `drmas-learner` builds it (`trained_policy`, the config's model settings), then per step batch the real
   `PolicyTrainer.update` (advantages as the colocated loop computes them), a real weight push of the live
   weights (`WeightSender` from `pipeline.weights` to a `WeightReceiver` in a third process), and at the end a
   real checkpoint (`BatchFanout.save`: DCP trainer state and the Hugging Face directory).
3. The evaluation before training, in a child of its own as the launcher runs it (`heldout_of_models`,
   `eval.n_problems` problems; `--eval-problems` caps them to save time).

Peaks are the kernel's high-water mark of the process's resident memory (VmHWM), reset at every phase
boundary (/proc/self/clear_refs), so a phase's peak is exact, not sampled. Inside an update the boundaries
are the model's forward (forward pre-hook and hook on the model), `Tensor.backward` and `optimizer.step`:
"forward" is the model's forward with gradients, "log-softmax + loss" what follows it up to the backward,
"backward" includes the recomputation of checkpointed layers. Everything runs the code of the tree it is
run from, so running this file from a checkout of another revision (PYTHONPATH) measures that revision.

Prints one table per config and the learner's peak / floor (the issue's targets: <= 1.5x on the quick
start; the search quick start's largest process <= 2x).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {"quickstart": "configs/quickstart.yaml", "search": "configs/search_quickstart.yaml"}
FLOOR_BYTES_PER_PARAM = 16  # float32 weights, gradients, AdamW exp_avg and exp_avg_sq


# ------------------------------------------------------------------------------------------ measuring


def _status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) * 1024
    return values


class Phases:
    """Peak resident memory per named phase: `mark(name)` closes the phase running since the last mark (its
    peak is VmHWM, then reset) and opens `name`. A name seen again keeps its largest peak."""

    def __init__(self) -> None:
        self.peaks: dict[str, int] = {}
        self.current = "start"
        self._reset()

    @staticmethod
    def _reset() -> None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current VmRSS

    def mark(self, name: str) -> None:
        peak = _status()["VmHWM"]
        self.peaks[self.current] = max(self.peaks.get(self.current, 0), peak)
        self.current = name
        self._reset()

    @contextmanager
    def phase(self, name: str, after: str = "idle"):
        self.mark(name)
        try:
            yield
        finally:
            self.mark(after)


@contextmanager
def update_phases(phases: Phases, trainer):
    """Marks the phases inside `PolicyTrainer.update` at torch-level calls (no learner code changed)."""
    import torch

    model, optimizer = trainer.model, trainer.optimizer

    def pre_forward(*_):
        phases.mark("forward" if torch.is_grad_enabled() else "forward (no grad)")

    def post_forward(*_):
        phases.mark("log-softmax + loss" if torch.is_grad_enabled() else "log-probs (no grad)")

    original_backward, original_step = torch.Tensor.backward, optimizer.step

    def backward(self, *args, **kwargs):
        phases.mark("backward")
        try:
            return original_backward(self, *args, **kwargs)
        finally:
            phases.mark("update: rest")

    def step(*args, **kwargs):
        phases.mark("optimizer step")
        try:
            return original_step(*args, **kwargs)
        finally:
            phases.mark("update: rest")

    hooks = [model.register_forward_pre_hook(pre_forward), model.register_forward_hook(post_forward)]
    torch.Tensor.backward, optimizer.step = backward, step
    try:
        phases.mark("update: rest")
        yield
    finally:
        torch.Tensor.backward = original_backward
        optimizer.step = original_step
        for hook in hooks:
            hook.remove()


# ------------------------------------------------------------------------------------------ samples


def record_samples(config: str, updates: int, out: Path) -> None:
    """Play `updates` steps of the config's episodes on its real model and engine; store the samples."""
    import msgspec
    import torch

    from drmas import assembly
    from drmas.core.sample import encode_sample
    from drmas.rollout.episodes import EpisodeRequest, EpisodeRunner
    from drmas.tasks.sampler import ProblemSampler

    cfg = assembly.load_config(ROOT / config)
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    task = assembly.build_task(cfg)
    engines = {m: assembly.build_engine(cfg, m, assembly.model_path(cfg, m), cfg.trainer.seed) for m in cfg.models}
    runner = EpisodeRunner(assembly.build_orchestra(cfg, task), engines, assembly.agent_specs(cfg),
                           cfg.algorithm.invalid_penalty, seed=cfg.trainer.seed)
    sampler = ProblemSampler(task.split("train"), cfg.trainer.seed)
    steps = []
    for step in range(updates):
        problems = sampler.next(cfg.rollout.prompts_per_step)
        requests = [EpisodeRequest(f"s{step}-g{g}-e{e}", f"s{step}-g{g}", problem)
                    for g, problem in enumerate(problems) for e in range(cfg.rollout.group_size)]
        steps.append([encode_sample(s) for result in runner.run(requests) for s in result.samples])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(msgspec.msgpack.encode(steps))
    tmp.rename(out)


def load_samples(path: Path):
    import msgspec

    from drmas.core.sample import decode_sample

    return [[decode_sample(s) for s in step] for step in msgspec.msgpack.decode(path.read_bytes())]


# ------------------------------------------------------------------------------------------ the learner


def _receiver(endpoint: str, model: str, ready) -> None:
    """A rollout's side of the weight channel: takes every version, copies nothing (not what is measured)."""
    from drmas.weights import WeightReceiver

    def apply(named, version: int, incarnation: str = "") -> None:
        for _ in named:
            pass

    WeightReceiver(endpoint, "bench", apply, model=model, background=True).start()
    ready.set()
    time.sleep(3600)  # the parent kills us


def measure_learner(config: str, samples_file: Path, out_dir: Path, overrides: list[str]) -> dict:
    """Runs in a fresh process: the learner's phases (module docstring), peak bytes per phase."""
    phases = Phases()
    with phases.phase("import"):
        import numpy as np  # noqa: F401
        import torch

        from drmas import assembly
        from drmas.learner.advantage import step_advantages
        from drmas.learner.ranks.group import BatchFanout
        from drmas.learner.ranks.single import SingleRank
        from drmas.learner.running_stats import AgentRewardStats
        from drmas.learner.worker import trained_policy
        from drmas.weights import WeightSender
    cfg = assembly.load_config(ROOT / config, overrides)
    (model_id,) = assembly.trained_models(cfg)
    if cfg.trainer.threads > 0:
        torch.set_num_threads(cfg.trainer.threads)
    steps = load_samples(samples_file)
    with phases.phase("load model + optimizer"):
        trainer, tokenizer = trained_policy(cfg, model_id, SingleRank(), torch.device("cpu"))
    params = sum(p.numel() for p in trainer.model.parameters())
    stats = AgentRewardStats(window=cfg.algorithm.running_stats_window)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    seconds, cpu_seconds, tokens = [], [], []
    with WeightSender.from_config(cfg.pipeline.weights, "127.0.0.1", model=model_id) as sender:
        child = ctx.Process(target=_receiver, args=(sender.endpoint, model_id, ready), daemon=True)
        child.start()
        try:
            deadline = time.monotonic() + 120
            while not (ready.is_set() and sender.receivers()):
                if time.monotonic() > deadline or not child.is_alive():
                    raise RuntimeError("the weight receiver did not connect")
                time.sleep(0.05)
            source = trainer.weight_source()
            for version, samples in enumerate(steps):
                agents = set(assembly.trained_agents(cfg, model_id))
                samples = [s for s in samples if s.agent in agents]
                adv = step_advantages(samples, cfg.algorithm, stats)
                start, cpu = time.perf_counter(), time.process_time()
                with update_phases(phases, trainer):
                    trainer.update(samples, adv, version=version)
                phases.mark("idle")
                seconds.append(time.perf_counter() - start)
                cpu_seconds.append(time.process_time() - cpu)
                tokens.append(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
                with phases.phase("weight push"):
                    report = sender.push(source, version + 1)
                if report.receivers_ok != ["bench"]:
                    raise RuntimeError(f"the weight push failed: {report}")
        finally:
            child.kill()
            child.join(5)
    with phases.phase("checkpoint save (DCP + HF)"):
        BatchFanout(SingleRank()).save(trainer, out_dir, len(steps), source, tokenizer, {"version": len(steps)})
    phases.mark("end")
    return {"params": params, "peaks": phases.peaks, "update_seconds": seconds, "update_cpu_seconds": cpu_seconds, "update_tokens": tokens,
            "samples": [len(s) for s in steps]}


def measure_eval(config: str, problems: int, overrides: list[str]) -> dict:
    """Runs in a fresh process: the launcher's held-out evaluation before training."""
    phases = Phases()
    with phases.phase("import"):
        from drmas import assembly
        from drmas.evaluation.async_heldout import heldout_of_models
    cfg = assembly.load_config(ROOT / config, [*overrides, *([f"eval.n_problems={problems}"] if problems else [])])
    task = assembly.build_task(cfg)
    with phases.phase("evaluation before training"):
        heldout_of_models(cfg, "before", None, task)
    phases.mark("end")
    return {"peaks": phases.peaks}


# ------------------------------------------------------------------------------------------ driver


def _child(args: list[str]) -> dict:
    """Run this file with `args` in a fresh interpreter; its last stdout line is the JSON result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child {args} failed with exit code {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


LEARNER_ORDER = ["import", "load model + optimizer", "forward", "log-softmax + loss", "backward", "optimizer step",
                 "forward (no grad)", "log-probs (no grad)", "update: rest", "weight push",
                 "checkpoint save (DCP + HF)"]


def report(name: str, learner: dict, evaluation: dict | None) -> None:
    floor = learner["params"] * FLOOR_BYTES_PER_PARAM
    peaks = learner["peaks"]
    peak = max(peaks.values())
    print(f"\n{name}: {learner['params'] / 1e6:.1f}M parameters, floor {floor / 1e9:.2f} GB (x16 bytes); "
          f"{len(learner['samples'])} updates of {learner['samples']} samples, "
          f"{learner['update_tokens']} tokens; update time {[round(s, 1) for s in learner['update_seconds']]} s, "
          f"CPU {[round(s, 1) for s in learner['update_cpu_seconds']]} s")
    print(f"  {'learner phase':<30} {'peak GB':>8} {'/ floor':>8}")
    for phase in LEARNER_ORDER:
        if phase in peaks:
            print(f"  {phase:<30} {peaks[phase] / 1e9:8.2f} {peaks[phase] / floor:7.2f}x")
    if evaluation:
        eval_peak = evaluation["peaks"]["evaluation before training"]
        print(f"  {'evaluation before training':<30} {eval_peak / 1e9:8.2f} {eval_peak / floor:7.2f}x"
              "  (launcher process)")
    print(f"  learner peak / floor: {peak / 1e9:.2f} GB / {floor / 1e9:.2f} GB = {peak / floor:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--updates", type=int, default=2, help="step batches to record and train on")
    parser.add_argument("--samples-dir", type=Path, default=ROOT / "runs" / "bench_memory")
    parser.add_argument("--eval-problems", type=int, default=0,
                        help="held-out problems the evaluation phase plays (0: the config's eval.n_problems; "
                             "-1: skip the evaluation)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for the learner and the evaluation, e.g. "
                             "models.smollm2.activation_checkpointing=false")
    parser.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, config, *rest = args.child
        overrides = json.loads(rest.pop())
        if kind == "record":
            record_samples(config, int(rest[0]), Path(rest[1]))
            print(json.dumps({}))
        elif kind == "learner":
            print(json.dumps(measure_learner(config, Path(rest[0]), Path(rest[1]), overrides)))
        else:
            print(json.dumps(measure_eval(config, int(rest[0]), overrides)))
        return
    for name in args.configs:
        config = CONFIGS[name]
        samples = args.samples_dir / f"{name}-{args.updates}.samples"
        if not samples.exists():
            print(f"{name}: recording {args.updates} steps of samples into {samples} ...", flush=True)
            _child(["--child", "record", config, str(args.updates), str(samples), "[]"])
        overrides = json.dumps(args.set)
        with tempfile.TemporaryDirectory(prefix="bench-memory-") as out:
            learner = _child(["--child", "learner", config, str(samples), out, overrides])
        evaluation = (None if args.eval_problems < 0 else
                      _child(["--child", "eval", config, str(args.eval_problems), overrides]))
        report(name, learner, evaluation)


if __name__ == "__main__":
    main()
