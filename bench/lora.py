"""Benchmark: one LoRA adapter per agent on a shared base vs a full model per agent, on SmolLM2-135M (issue 29).

Run on demand (not part of the tests):

    .venv/bin/python bench/lora.py [--reps 3] [--rank 16] [--rss]

All ratios come from one run, both sides measured alternately on the same machine:

(a) push: bytes and seconds of one adapter's weight push vs a full push of the model, `WeightSender` ->
    `WeightReceiver` in another process that applies them into real embedded engines (the full model's
    `load_weights`; the adapter engine's `AdapterSlot`, whose one copy of the base is never sent). Goal: an
    adapter push carries <= 2% of the bytes.
(b) learner step: `PolicyTrainer.update` on the same samples, the full model vs one adapter over the frozen base
    (forward and backward through the whole base either way; the adapter saves the base's gradients and AdamW
    state and the optimizer step over 135M parameters).
(c) with --rss (only): the learner processes of a 3-agent run in each layout, each process fresh and built by the
    learner's own `learner_trainers` (heap setting included), `--reps` + 1 updates per model of 8 x 280 tokens:
    one learner over the three adapters (issue 40's default), a learner per adapter (`learner_per_adapter: true`),
    a full-model learner per agent. Peak RSS summed over the processes, median update seconds per model, push
    bytes per adapter. Goal: one learner of 3 adapters <= 1.3x one adapter learner's RSS, updates no slower.
(d) with --checkpointing: peak RSS of one adapter learner's update on quick-start-sized samples (8 x 280 tokens,
    one micro-batch of 8), `models.base.activation_checkpointing` true vs false, each in a fresh process with
    the learner's heap setting (`models.base.heap_mmap_threshold_kb`).

(b) runs both sides with the config's `activation_checkpointing` (default true).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drmas import assembly  # noqa: E402
from drmas.config import read_config  # noqa: E402
from drmas.config.weights import WeightSyncConfig  # noqa: E402
from drmas.core.sample import Sample  # noqa: E402
from drmas.engines.base import AdapterSlot, SamplingParams  # noqa: E402
from drmas.learner.heap import map_large_blocks  # noqa: E402
from drmas.learner.policy import PolicyTrainer  # noqa: E402
from drmas.learner.trainers import adapter_trainers, learner_trainers  # noqa: E402
from drmas.models.loading import load_model  # noqa: E402
from drmas.weights import WeightReceiver, WeightSender  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("solver", "verifier", "reviser")
CPU = torch.device("cpu")


def config(rank: int, agents: int, *extra: str):
    """SmolLM2-135M with one adapter per agent (`base/<agent>`), float32 as on this CPU."""
    names = AGENTS[:agents] if agents > 2 else AGENTS[:2]  # the smoke config's two, and a reviser's for 3
    overrides = ["models.base.builtin=smollm2-135m-instruct", "models.base.adapters.solver.optim=null",
                 *(f"models.base.adapters.{a}.rank={rank}" for a in names),
                 *(f"models.base.adapters.{a}.alpha={2 * rank}" for a in names), *extra]
    return read_config(ROOT / "configs" / "smoke_lora.yaml", overrides)


def full_trainer(path: Path) -> PolicyTrainer:
    cfg = config(16, 1)
    model, _ = load_model(path)
    return PolicyTrainer("full", model, cfg.models["base"].optim, cfg.algorithm,
                         activation_checkpointing=cfg.models["base"].activation_checkpointing)


def samples_of(engine, adapter: str, n: int = 8) -> list[Sample]:
    tok = engine.tokenizer
    prompts = [tok.encode(f"Question {i}: what is {i} times {i + 3}? Think step by step.") for i in range(n)]
    gens = engine.generate(prompts, [SamplingParams(temperature=1.0, max_new_tokens=32, seed=i, adapter=adapter)
                                     for i in range(n)])
    return [Sample(episode_id=f"e{i}", group_id="g", agent="solver", model="m", turn=0, prompt_ids=p,
                   response_ids=g.token_ids, behaviour_logprobs=g.logprobs, policy_version=0, temperature=1.0,
                   valid=True, reward=float(i % 2)) for i, (p, g) in enumerate(zip(prompts, gens))]


# ---- (a) pushes --------------------------------------------------------------------------------------------

def _receiver(endpoints: dict[str, str], rank: int, threads: int, done: mp.Queue) -> None:
    """The other process: a full engine and an adapter engine, each fed by its own receiver."""
    torch.set_num_threads(threads)
    cfg = config(rank, 1)
    path = assembly.model_path(cfg, "base")
    full = assembly.ENGINES.get("embedded")("full", path)
    adapter = assembly.build_engines(cfg, 0)["base"]
    targets = {"full": full.load_weights, "adapter": AdapterSlot(adapter, "solver").load_weights}

    def applier(kind):
        def apply(named, version, incarnation=""):
            start = time.perf_counter()
            targets[kind](named, version, incarnation)
            done.put((kind, version, time.perf_counter() - start))
        return apply

    receivers = [WeightReceiver(endpoints[k], f"bench-{k}", applier(k), background=True).start() for k in targets]
    done.put(("ready", 0, 0.0))
    time.sleep(3600)  # the parent kills us
    del receivers


def pushes(rank: int, reps: int, full: PolicyTrainer, adapter: PolicyTrainer) -> dict[str, list]:
    ctx = mp.get_context("spawn")
    wcfg = WeightSyncConfig(chunk_mb=32, timeout_s=300, ready_timeout_s=300, backend="gloo")
    done: mp.Queue = ctx.Queue()
    with WeightSender("127.0.0.1", config=wcfg) as s_full, WeightSender("127.0.0.1", config=wcfg) as s_adapter:
        senders = {"full": s_full, "adapter": s_adapter}
        child = ctx.Process(target=_receiver, args=({k: s.endpoint for k, s in senders.items()}, rank, torch.get_num_threads(), done),
                            daemon=True)
        child.start()
        try:
            assert done.get(timeout=600)[0] == "ready"
            deadline = time.monotonic() + 300
            while not all(s.receivers() for s in senders.values()):
                if time.monotonic() > deadline or not child.is_alive():
                    raise RuntimeError("the receivers did not connect")
                time.sleep(0.05)
            out: dict[str, list] = {"full": [], "adapter": [], "full_bytes": [], "adapter_bytes": []}
            sources = {"full": full, "adapter": adapter}
            for version in range(1, reps + 2):  # the first of each: warm-up
                for kind, sender in senders.items():
                    report = sender.push(list(sources[kind].named_tensors()), version)
                    if len(report.receivers_ok) != 1:
                        raise RuntimeError(f"{kind} push failed: {report}")
                    got = done.get(timeout=300)
                    assert got[:2] == (kind, version), got
                    if version > 1:
                        out[kind].append(report.seconds)
                        out[f"{kind}_bytes"].append(report.bytes)
            return out
        finally:
            child.kill()
            child.join(5)


# ---- (b) learner steps -------------------------------------------------------------------------------------

def steps(reps: int, full: PolicyTrainer, adapter: PolicyTrainer, samples: list[Sample]) -> dict[str, list]:
    adv = np.array([1.0, -1.0] * (len(samples) // 2))
    out: dict[str, list] = {"full": [], "adapter": []}
    for rep in range(reps + 1):
        for kind, trainer in (("full", full), ("adapter", adapter)):
            start = time.perf_counter()
            trainer.update(samples, adv)
            print(f"  step {kind} {time.perf_counter() - start:.2f} s", file=sys.stderr, flush=True)
            if rep:
                out[kind].append(time.perf_counter() - start)
    return out


# ---- (c) the learner processes of a 3-agent run ----------------------------------------------------------------

LAYOUTS = ("one learner", "learner per adapter", "full models")


def synthetic_samples(n: int = 8) -> list[Sample]:
    """Quick-start-sized samples: `n` x (200 prompt + 80 response) tokens, in one micro-batch."""
    rng = np.random.default_rng(0)
    return [Sample(episode_id=f"e{i}", group_id="g", agent="solver", model="m", turn=0,
                   prompt_ids=rng.integers(100, 40000, 200).tolist(), response_ids=rng.integers(100, 40000, 80).tolist(),
                   behaviour_logprobs=np.full(80, -3.0, dtype=np.float32), policy_version=0, temperature=1.0,
                   valid=True, reward=float(i % 2)) for i in range(n)]


def learner(layout: str, rank: int, reps: int) -> None:
    """Child: what one learner process of `layout` builds (`learner_trainers`, the learner's own code, heap setting
    included), then `reps` + 1 updates per trained model in turn on the same samples (the first a warm-up); prints
    a JSON line: peak RSS (MB), the median update seconds and the push bytes of each model it trains."""
    cfg = config(rank, 3, "algorithm.micro_batch_size=8")
    if layout == "one learner":
        ids = [f"base/{a}" for a in AGENTS]
    elif layout == "learner per adapter":
        ids = ["base/solver"]
    else:  # a full model's learner: the same SmolLM2 trained whole
        cfg = config(rank, 3, "algorithm.micro_batch_size=8", "models.full.builtin=smollm2-135m-instruct",
                     "agents.solver.model=full", "agents.verifier.model=full")
        ids = ["full"]
    trainers, _ = learner_trainers(cfg, ids, None, CPU)
    samples, adv = synthetic_samples(), np.array([1.0, -1.0] * 4)
    seconds: dict[str, list[float]] = {t.model_id: [] for t in trainers}
    for rep in range(reps + 1):
        for trainer in trainers:
            start = time.perf_counter()
            trainer.update(samples, adv)
            if rep or not reps:
                seconds[trainer.model_id].append(time.perf_counter() - start)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "update_s": {m: statistics.median(v) for m, v in seconds.items()},
                      "push_bytes": {t.model_id: sum(x.numel() * x.element_size() for _, x in t.named_tensors())
                                     for t in trainers}}))


def learners(rank: int, reps: int) -> dict[str, list[dict]]:
    """Every learner process of each layout, one after another (3 agents: one process, or three)."""
    out: dict[str, list[dict]] = {}
    for layout in LAYOUTS:
        processes = 1 if layout == "one learner" else len(AGENTS)
        out[layout] = []
        for i in range(processes):
            print(f"  {layout}: process {i + 1} of {processes}", file=sys.stderr, flush=True)
            line = _child_output("--learner", layout, "--rank", str(rank), "--reps", str(reps))
            out[layout].append(json.loads(line))
    return out


def report_learners(runs: dict[str, list[dict]]) -> None:
    one, per, full = (runs[k] for k in LAYOUTS)
    rss = {k: sum(p["peak_rss_mb"] for p in v) for k, v in runs.items()}
    step = {k: statistics.median(s for p in v for s in p["update_s"].values()) for k, v in runs.items()}
    single = statistics.median(p["peak_rss_mb"] for p in per)
    print("(c) learner processes of 3 agents, peak RSS (all processes) / median update per model:")
    for k in LAYOUTS:
        print(f"    {k:20s} {len(runs[k])} process(es)  {rss[k]:7.0f} MB  {step[k]:6.2f} s  (per process: "
              + "; ".join(f"{p['peak_rss_mb']:.0f} MB, " + ", ".join(f"{s:.2f}" for s in p["update_s"].values()) + " s"
                          for p in runs[k]) + ")")
    print(f"    one learner of 3 adapters / one adapter learner: {one[0]['peak_rss_mb'] / single:.2f}x RSS "
          f"(goal <= 1.3x); / three adapter learners {rss[LAYOUTS[0]] / rss[LAYOUTS[1]]:.2f}x; / three full-model "
          f"learners {rss[LAYOUTS[0]] / rss[LAYOUTS[2]]:.2f}x; update per adapter {step[LAYOUTS[0]] / step[LAYOUTS[1]]:.2f}x "
          f"of an adapter learner's")
    pushed = {m: b for p in one + per for m, b in p["push_bytes"].items()}
    same = all(one[0]["push_bytes"][m] == b for p in per for m, b in p["push_bytes"].items())
    print(f"    push bytes per adapter {sorted(set(pushed.values()))} (same in both layouts: {same}); a full model's "
          f"{full[0]['push_bytes']['full'] / 1e6:.1f} MB; load {os.getloadavg()[0]:.1f}", flush=True)


# ---- (d) activation checkpointing of an adapter's learner ---------------------------------------------------

def update_peak(checkpointing: bool, rank: int) -> None:
    """Child: one adapter trainer, one update of 8 samples of 200 prompt + 80 response tokens in one micro-batch;
    print the peak RSS (MB) after building it and after the update."""
    cfg = config(rank, 1, f"models.base.activation_checkpointing={str(checkpointing).lower()}",
                 "algorithm.micro_batch_size=8")
    map_large_blocks(cfg.models["base"].heap_mmap_threshold_kb)  # as a learner process does
    (trainer,), _ = adapter_trainers(cfg, ["base/solver"], CPU)
    samples = synthetic_samples()
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trainer.update(samples, np.array([1.0, -1.0] * 4))
    print(built, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def _child_output(*args: str) -> str:
    """The last line a fresh process of this script prints (one measurement: its own peak RSS)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, *args, "--threads", str(torch.get_num_threads())],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _child(*args: str) -> list[float]:
    return [float(x) for x in _child_output(*args).split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--rss", action="store_true",
                        help="(c) only: the learner processes of 3 agents in each layout, peak RSS and update time")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every process (1: on a shared, oversubscribed machine 2 threads "
                        "spin-wait on each other; a SmolLM2 forward took 6-10 s there instead of 0.5 s)")
    parser.add_argument("--checkpointing", action="store_true",
                        help="(d) only: an adapter learner's update peak RSS with and without activation checkpointing")
    parser.add_argument("--learner", choices=LAYOUTS, help=argparse.SUPPRESS)
    parser.add_argument("--update-peak", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.learner:
        learner(args.learner, args.rank, args.reps)
        return
    if args.rss:
        report_learners(learners(args.rank, args.reps))
        return
    if args.update_peak:
        update_peak(args.update_peak == "on", args.rank)
        return
    if args.checkpointing:
        peak = {on: _child("--update-peak", on, "--rank", str(args.rank)) for on in ("on", "off")}
        (b_on, p_on), (b_off, p_off) = peak["on"], peak["off"]
        print(f"(d) adapter learner, one update of 8 x 280 tokens: peak RSS {p_on:.0f} MB with activation "
              f"checkpointing, {p_off:.0f} MB without -> {p_on / p_off:.2f}x; above the built trainer "
              f"({b_on:.0f} / {b_off:.0f} MB): {p_on - b_on:.0f} vs {p_off - b_off:.0f} MB; "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        return

    cfg = config(args.rank, 1)
    path = assembly.model_path(cfg, "base")
    print("building trainers and an engine", file=sys.stderr, flush=True)
    (adapter,), _ = adapter_trainers(cfg, ["base/solver"], CPU)
    full = full_trainer(path)
    engine = assembly.build_engines(cfg, 0)["base"]
    samples = samples_of(engine, "solver")
    print(f"{len(samples)} samples, {sum(len(x.response_ids) for x in samples)} response tokens", file=sys.stderr,
          flush=True)
    print(f"SmolLM2-135M, float32 on CPU, {torch.get_num_threads()} torch threads, adapter rank {args.rank} on "
          f"{cfg.models['base'].adapters['solver'].target_modules}; load {os.getloadavg()[0]:.1f}", flush=True)

    t = steps(args.reps, full, adapter, samples)
    med = {k: statistics.median(v) for k, v in t.items()}
    print(f"(b) learner step, {len(samples)} samples: full {med['full']:.2f} s, adapter {med['adapter']:.2f} s "
          f"-> {med['adapter'] / med['full']:.2f}x  (runs {t}; load {os.getloadavg()[0]:.1f})", flush=True)

    p = pushes(args.rank, args.reps, full, adapter)
    fb, ab = p["full_bytes"][0], p["adapter_bytes"][0]
    fs, as_ = statistics.median(p["full"]), statistics.median(p["adapter"])
    print(f"(a) push: full {fb / 1e6:.1f} MB in {fs:.3f} s, adapter {ab / 1e6:.2f} MB in {as_:.3f} s -> "
          f"{ab / fb:.2%} of the bytes (goal <= 2%), {as_ / fs:.2%} of the time  (runs {p['full']} / {p['adapter']}; load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
