"""Benchmark: the learner's peak memory per phase on the quick starts, next to the floor its weights and
optimiser need (parameters x 16 bytes: float32 weights, gradients and AdamW's two moments).

Run on demand (not part of the tests; SmolLM2-135M, a few minutes per config on 2 cores):

    .venv/bin/python bench/memory.py [--configs quickstart search] [--updates 2] [--samples-dir runs/bench_memory]
                                     [--baseline REV | --baseline none] [--eval-problems N]

Before and after in the same run: the learner is measured twice on the same samples, once with the code of git
revision `--baseline` (default: main just before issue 25's memory work, exported with `git archive` into a
temporary directory) and once with this tree; the table shows both peaks per phase and their ratio.

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
are the decoder's forward (forward pre-hook and hook on `model.get_decoder()`), `Tensor.backward` and
`optimizer.step`: "forward" is the decoder's forward with gradients, "log-softmax + loss" what follows it up to
the backward (the LM head included: the learner fuses it with the log-softmax, `drmas.engines.fused_head`),
"backward" includes the recomputation of checkpointed layers. The held-out evaluation is measured with this
tree only (issue 25 changed nothing there). Each figure is printed with the machine's load average.

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
# the tree whose code and configs a child measures: this one, or the baseline revision's export
CODE = Path(os.environ.get("DRMAS_BENCH_TREE", ROOT))
sys.path.insert(0, str(CODE))
# main before issue 25 (activation checkpointing, chunked log-softmax, the learner's heap setting)
BASELINE_REV = "e213c39b2bc62de531a1d3229f0f0150b8f9f625"

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

    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model  # the head is fused in the chunks
    hooks = [decoder.register_forward_pre_hook(pre_forward), decoder.register_forward_hook(post_forward)]
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
    from drmas.episodes import EpisodeRequest, EpisodeRunner
    from drmas.tasks.sampler import ProblemSampler

    cfg = assembly.load_config(CODE / config)
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


def _receiver(endpoint: str, model: str, ready, parent: int) -> None:
    """A rollout's side of the weight channel: takes every version, copies nothing (not what is measured).
    Ends when its parent is gone (a learner child killed for memory would otherwise leave it holding the
    bench's stdout pipe, and the bench waiting)."""
    from drmas.weights import WeightReceiver

    def apply(named, version: int, incarnation: str = "") -> None:
        for _ in named:
            pass

    WeightReceiver(endpoint, "bench", apply, model=model, background=True).start()
    ready.set()
    while os.getppid() == parent:  # the parent kills us when done
        time.sleep(1)


def measure_learner(config: str, samples_file: Path, out_dir: Path, overrides: list[str]) -> dict:
    """Runs in a fresh process: the learner's phases (module docstring), peak bytes per phase."""
    phases = Phases()
    with phases.phase("import"):
        import numpy as np  # noqa: F401
        import torch

        from drmas import assembly
        from drmas.algorithms.estimators import step_advantages
        from drmas.learner.ranks.group import BatchFanout
        from drmas.learner.ranks.single import SingleRank
        from drmas.algorithms.running_stats import AgentRewardStats
        from drmas.learner.trainers import trained_policy
        from drmas.weights import WeightSender
    cfg = assembly.load_config(CODE / config, overrides)
    (model_id,) = assembly.trained_models(cfg)
    try:  # as drmas-learner does at its start: this may re-execute the child with jemalloc preloaded
        from drmas.learner.allocator import use_allocator

        note = use_allocator(assembly.model_config(cfg, model_id).allocator)
        if note:
            print(note, file=sys.stderr)
    except (ImportError, AttributeError):  # the baseline tree has no such setting
        pass
    try:  # as drmas-learner does before any tensor (the baseline tree has no such setting)
        from drmas.learner.heap import advise_huge_pages

        advise_huge_pages(assembly.model_config(cfg, model_id).huge_pages)
    except (ImportError, AttributeError):
        pass
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
        child = ctx.Process(target=_receiver, args=(sender.endpoint, model_id, ready, os.getpid()), daemon=True)
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
    cfg = assembly.load_config(CODE / config, [*overrides, *([f"eval.n_problems={problems}"] if problems else [])])
    task = assembly.build_task(cfg)
    with phases.phase("evaluation before training"):
        heldout_of_models(cfg, "before", None, task)
    phases.mark("end")
    return {"peaks": phases.peaks}


# ------------------------------------------------------------------------------------------ driver


def _child(args: list[str], tree: Path = ROOT) -> dict:
    """Run this file with `args` in a fresh interpreter on the code of `tree`; its last stdout line is the JSON
    result, to which the load averages before and after are added."""
    env = {**os.environ, "DRMAS_BENCH_TREE": str(tree),
           "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, *args], env=env, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child {args} failed with exit code {proc.returncode}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load": [load, os.getloadavg()[0]]}


@contextmanager
def exported(rev: str):
    """The files of git revision `rev` of this repository in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="bench-memory-base-") as tree:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
        yield Path(tree)


def measure(config: str, samples: Path, tree: Path, overrides: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as out:
        return _child(["--child", "learner", config, str(samples), out, json.dumps(overrides)], tree)


LEARNER_ORDER = ["import", "load model + optimizer", "forward", "log-softmax + loss", "backward", "optimizer step",
                 "forward (no grad)", "log-probs (no grad)", "update: rest", "weight push",
                 "checkpoint save (DCP + HF)"]


def _timing(label: str, learner: dict) -> str:
    return (f"  {label}: update time {[round(s, 1) for s in learner['update_seconds']]} s, CPU "
            f"{[round(s, 1) for s in learner['update_cpu_seconds']]} s; load average {learner['load'][0]:.1f} "
            f"-> {learner['load'][1]:.1f}")


def report(name: str, after: dict, before: dict | None, evaluation: dict | None) -> None:
    """One table per config: peak GB per phase before and after, after / before, after / floor."""
    floor = after["params"] * FLOOR_BYTES_PER_PARAM
    print(f"\n{name}: {after['params'] / 1e6:.1f}M parameters, floor {floor / 1e9:.2f} GB (x16 bytes); "
          f"{len(after['samples'])} updates of {after['samples']} samples, {after['update_tokens']} tokens")
    if before:
        print(_timing("before", before))
    print(_timing("after ", after))
    print(f"  {'learner phase':<30} {'before GB':>9} {'after GB':>9} {'after/before':>12} {'after/floor':>11}")
    b_peaks = before["peaks"] if before else {}
    for phase in LEARNER_ORDER:
        if phase in after["peaks"] or phase in b_peaks:
            a, b = after["peaks"].get(phase), b_peaks.get(phase)
            print(f"  {phase:<30} {b / 1e9 if b else float('nan'):9.2f} {a / 1e9 if a else float('nan'):9.2f} "
                  f"{a / b if a and b else float('nan'):11.2f}x {a / floor if a else float('nan'):10.2f}x")
    if evaluation:
        eval_peak = evaluation["peaks"]["evaluation before training"]
        print(f"  {'evaluation before training':<30} {'':>9} {eval_peak / 1e9:9.2f} {'':>12} "
              f"{eval_peak / floor:10.2f}x  (launcher process; load {evaluation['load'][1]:.1f})")
    peak = max(after["peaks"].values())
    if before:
        b_peak = max(b_peaks.values())
        print(f"  learner peak before / floor: {b_peak / 1e9:.2f} GB / {floor / 1e9:.2f} GB = {b_peak / floor:.2f}x")
    print(f"  learner peak after / floor:  {peak / 1e9:.2f} GB / {floor / 1e9:.2f} GB = {peak / floor:.2f}x")
    if before:
        print(f"  learner peak after / before: {peak / b_peak:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--updates", type=int, default=2, help="step batches to record and train on")
    parser.add_argument("--samples-dir", type=Path, default=ROOT / "runs" / "bench_memory")
    parser.add_argument("--eval-problems", type=int, default=0,
                        help="held-out problems the evaluation phase plays (0: the config's eval.n_problems; "
                             "-1: skip the evaluation)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides for this tree's learner and evaluation (not the baseline's), e.g. "
                             "models.smollm2.activation_checkpointing=false")
    parser.add_argument("--baseline", default=BASELINE_REV,
                        help="git revision whose learner is measured as 'before' (none: skip it)")
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
        before = None
        if args.baseline != "none":
            with exported(args.baseline) as tree:
                before = measure(config, samples, tree, [])
        after = measure(config, samples, ROOT, args.set)
        evaluation = (None if args.eval_problems < 0 else
                      _child(["--child", "eval", config, str(args.eval_problems), json.dumps(args.set)]))
        report(name, after, before, evaluation)


if __name__ == "__main__":
    main()
