"""drmas's GRPO against a reference implementation: TRL's `GRPOTrainer` on the same problem (issue 34, part 3).

Two questions, two commands:
- **parity**: with one agent, `global` advantages, on policy and colocated, does drmas learn as TRL does? Both
  train the same model on the same problems in the same order with the same sampling and optimiser (the mapping:
  bench/peer_trl.py; configs/peer.yaml), for each seed; the per-step training reward (mean over the step's 16
  completions) is compared per step with 95% intervals over seeds, and per seed as the mean over all steps.
- **speed**: drmas colocated, drmas async (buffer, learner and one rollout process) and TRL, one after another in
  one invocation on the same machine: samples/s and generated tokens/s over the steps after the first (start-up
  and the first step's warm-up excluded on all three), and the peak resident memory (RSS; the async run's is the
  peak of its processes' summed RSS). Figures are ratios to TRL measured in the same run.

    python bench/peer.py parity --out runs/peer --png docs/peer.png     # 3 seeds x 20 steps x 2 frameworks
    python bench/peer.py speed --out runs/peer_speed                    # 6 steps each, one seed
    python bench/peer.py parity --quick --out runs/peer_quick           # tiny model, 2 seeds x 2 steps: it runs
    python bench/peer.py speed --quick --out runs/peer_speed_quick
    python bench/peer.py parity --first-seed 2 --seeds 1 --out runs/peer    # one more seed into the same OUT
    python bench/peer.py parity --collect --out runs/peer                   # the report of the runs in OUT
    python bench/peer.py grad --out runs/peer_grad [--seeds 3]   # both gradients on one batch (bench/peer_grad.py)

Each run (framework x seed) is written to OUT/<framework>-seed<N>/result.json as soon as it finishes, and the
report covers every run in OUT. Runs go one at a time, each in its own process (they would compete for the 2
cores; peak RSS is per process). Needs the `peer` extra (`pip install -e ".[peer]"`: trl); the picture needs
`bench` (matplotlib). Parity caveats (what could not be made equal, which way it biases): docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_trl import train_trl  # noqa: E402
from learning_stats import t95  # noqa: E402
from report import commit, write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "configs/peer.yaml"
QUICK = ["models.policy={builtin: tiny, tiny: {hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128, "
         "seed: 0, prime_steps: 200}, optim: {lr: 1.0e-3, weight_decay: 0.01, grad_clip: 1.0}}", "task.n_train=64"]
RESULT = "result.json"


# ---- the runs ----------------------------------------------------------------------------------------------
def train_colocated(config: str, seed: int, steps: int, overrides: list[str], out: str) -> dict:
    """drmas's single-process loop; its per-step reward, tokens and times from metrics.jsonl; peak RSS."""
    from drmas import assembly
    from drmas.colocated import ColocatedRun
    from drmas.runtime.metrics import read_metrics

    cfg = assembly.load_config(config, [*overrides, f"trainer.steps={steps}", f"trainer.seed={seed}",
                                        f"trainer.output_dir={out}", "trainer.overwrite=true"])
    run = ColocatedRun(cfg, log=lambda line: print(f"[drmas seed {seed}] {line}", flush=True))
    run.save = lambda: None  # no checkpoint: nothing reads it
    run.run()
    records = [r for r in read_metrics(Path(out) / "metrics.jsonl") if "episode/reward_mean" in r]
    model = cfg.agents["solver"].model
    order = assembly.drawing_order(cfg)  # the order the run drew from: its first draws are the steps' problems
    return {
        "framework": "drmas", "seed": seed, "steps": len(records), "prompt_ids_match": True,
        "reward": [float(r["episode/reward_mean"]) for r in records],
        "tokens": [float(r.get(f"tokens/{model}", math.nan)) for r in records],
        "samples": [cfg.rollout.group_size * cfg.rollout.prompts_per_step] * len(records),
        "step_seconds": [float(r.get("time/step_seconds", math.nan)) for r in records],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prompts": [order.at(d).uid for d in range(len(records) * cfg.rollout.prompts_per_step)],
        "out": out,
    }


def train_async(config: str, seed: int, steps: int, overrides: list[str], out: str) -> dict:
    """`drmas run` with pipeline.mode=async (buffer, learner, one rollout): the learner's records give the
    times and tokens; the summed RSS of the run's processes is sampled every 0.2 s."""
    import psutil

    from drmas.runtime.metrics import read_metrics

    command = [sys.executable, "-m", "drmas.cli", "run", "--config", config, *overrides, f"trainer.steps={steps}",
               f"trainer.seed={seed}", f"trainer.output_dir={out}", "trainer.overwrite=true", "pipeline.mode=async",
               "pipeline.num_rollouts=1", "pipeline.learner_base_port=0", "pipeline.report_interval_s=1",
               "pipeline.buffer.producer_endpoint=tcp://127.0.0.1:0",
               "pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:0"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = 0.0
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        total = 0
        for p in [root, *root.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        peak = max(peak, total / 2**20)
        time.sleep(0.2)
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise RuntimeError(f"drmas async exited {proc.returncode}:\n{output[-3000:]}")
    learner = next(Path(out).glob("learner-*/metrics.jsonl"))
    records = [r for r in read_metrics(learner) if "step" in r and any(k.startswith("tokens/") for k in r)]
    times = [float(r["time"]) for r in records]
    group = _group_size(config, overrides)
    return {
        "framework": "drmas_async", "seed": seed, "steps": len(records), "prompt_ids_match": True,
        "reward": [float(next((v for k, v in r.items() if k.startswith("reward/") and k.endswith("/mean")), math.nan))
                   for r in records],
        "tokens": [float(next(v for k, v in r.items() if k.startswith("tokens/"))) for r in records],
        "samples": [group] * len(records),
        # between learner records: the first step's own time is unknown (start-up), as if its warm-up
        "step_seconds": [math.nan, *(b - a for a, b in zip(times, times[1:]))],
        "peak_rss_mb": peak, "prompts": [], "out": out,
    }


def _group_size(config: str, overrides: list[str]) -> int:
    from drmas import assembly

    cfg = assembly.load_config(config, overrides)
    return cfg.rollout.group_size * cfg.rollout.prompts_per_step


RUNNERS = {"drmas": train_colocated, "trl": train_trl, "drmas_async": train_async}


def run_one(framework: str, config: str, seed: int, steps: int, overrides: list[str], out: Path) -> dict:
    """One run in a process of its own (spawned: a clean heap for its peak RSS); its result is kept in OUT."""
    target = out / f"{framework}-seed{seed}"
    target.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        result = pool.submit(RUNNERS[framework], config, seed, steps, overrides, str(target)).result()
    result["wall_s"] = time.monotonic() - start
    (target / RESULT).write_text(json.dumps(result))
    print(f"done {framework} seed {seed}: {result['steps']} steps, reward {np.nanmean(result['reward']):.3f}, "
          f"{result['wall_s']:.0f} s", flush=True)
    return result


# ---- the figures -------------------------------------------------------------------------------------------
def interval(values) -> dict:
    """Mean and a 95% interval over seeds (t quantile for n-1 degrees of freedom; no interval from one value)."""
    v = np.asarray([x for x in values if math.isfinite(x)], dtype=float)
    n = len(v)
    if n == 0:
        return {"mean": math.nan, "low": math.nan, "high": math.nan, "n": 0}
    mean = float(v.mean())
    if n == 1:
        return {"mean": mean, "low": math.nan, "high": math.nan, "n": 1}
    half = t95(n) * float(v.std(ddof=1)) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def steady(run: dict) -> dict:
    """Samples/s and tokens/s over the steps after the first (its warm-up excluded), with the peak RSS."""
    timed = [i for i, s in enumerate(run["step_seconds"]) if i > 0 and math.isfinite(s)]
    total = sum(run["step_seconds"][i] for i in timed) or math.nan
    return {"samples_per_s": sum(run["samples"][i] for i in timed) / total,
            "tokens_per_s": sum(run["tokens"][i] for i in timed) / total,
            "peak_rss_mb": run["peak_rss_mb"], "steps_timed": len(timed)}


def _same_start(a: list[str], b: list[str]) -> bool:
    """Whether two runs' problems agree as far as both went (and both recorded some)."""
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def parity_table(runs: list[dict]) -> tuple[str, dict]:
    by = {f: [r for r in runs if r["framework"] == f] for f in ("drmas", "trl")}
    steps = min((r["steps"] for rs in by.values() for r in rs), default=0)
    curves = {f: [interval([r["reward"][i] for r in rs]) for i in range(steps)] for f, rs in by.items()}
    per_seed = {f: interval([np.mean(r["reward"][:steps]) for r in rs]) for f, rs in by.items()}
    paired = [np.mean(d["reward"][:steps]) - np.mean(t["reward"][:steps])
              for d in by["drmas"] for t in by["trl"] if d["seed"] == t["seed"]]
    overlap = sum(1 for a, b in zip(curves["drmas"], curves["trl"])
                  if not (a["low"] > b["high"] or b["low"] > a["high"]))
    summary = {"steps": steps, "curves": curves, "per_seed": per_seed, "difference": interval(paired),
               "overlapping_steps": overlap,
               "prompt_ids_match": all(r["prompt_ids_match"] for r in runs),
               "same_prompts": all(_same_start(d["prompts"], t["prompts"]) for d in by["drmas"] for t in by["trl"]
                                   if d["seed"] == t["seed"])}
    diff = summary["difference"]
    lines = [f"seeds drmas {[r['seed'] for r in by['drmas']]}, trl {[r['seed'] for r in by['trl']]}; {steps} steps; "
             f"prompt token ids equal: {summary['prompt_ids_match']}; same problems in the same order: "
             f"{summary['same_prompts']}",
             "", "| framework | mean training reward over all steps [95% CI over seeds] |", "|---|---|"]
    for f in ("drmas", "trl"):
        s = per_seed[f]
        lines.append(f"| {f} | {s['mean']:.3f} [{s['low']:.3f}, {s['high']:.3f}] |")
    lines += ["", f"drmas - trl, paired by seed: {diff['mean']:+.3f} [{diff['low']:+.3f}, {diff['high']:+.3f}]; "
              f"the per-step intervals overlap on {overlap} of {steps} steps", "",
              "| step | drmas [95% CI] | trl [95% CI] |", "|---|---|---|"]
    for i in range(steps):
        a, b = curves["drmas"][i], curves["trl"][i]
        lines.append(f"| {i + 1} | {a['mean']:.3f} [{a['low']:.3f}, {a['high']:.3f}] | "
                     f"{b['mean']:.3f} [{b['low']:.3f}, {b['high']:.3f}] |")
    return "\n".join(lines), summary


def speed_table(runs: list[dict]) -> tuple[str, dict]:
    figures = {r["framework"]: steady(r) for r in runs}
    base = figures.get("trl")
    lines = ["| framework | samples/s | generated tokens/s | peak RSS (MB) | steps timed | samples/s vs trl |",
             "|---|---|---|---|---|---|"]
    for f, s in figures.items():
        ratio = s["samples_per_s"] / base["samples_per_s"] if base else math.nan
        s["ratio_samples"] = ratio
        s["ratio_tokens"] = s["tokens_per_s"] / base["tokens_per_s"] if base else math.nan
        s["ratio_rss"] = s["peak_rss_mb"] / base["peak_rss_mb"] if base else math.nan
        lines.append(f"| {f} | {s['samples_per_s']:.2f} | {s['tokens_per_s']:.1f} | {s['peak_rss_mb']:.0f} | "
                     f"{s['steps_timed']} | {ratio:.2f}x |")
    lines.append("")
    lines += [f"{f}/trl: samples/s = {s['ratio_samples']:.2f}x, tokens/s = {s['ratio_tokens']:.2f}x, "
              f"peak RSS = {s['ratio_rss']:.2f}x" for f, s in figures.items() if f != "trl"]
    return "\n".join(lines), figures


def plot(result: dict, png: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')")
        return False
    curves = result["summary"]["curves"]
    fig, ax = plt.subplots(figsize=(7, 4))
    for f, color in (("drmas", "tab:blue"), ("trl", "tab:orange")):
        x = np.arange(1, len(curves[f]) + 1)
        for run in (r for r in result["runs"] if r["framework"] == f):  # each seed, thin
            ax.plot(x, run["reward"][:len(x)], color=color, alpha=0.35, linewidth=0.8)
        ax.plot(x, [c["mean"] for c in curves[f]], color=color, linewidth=2, label=f"{f} (mean over seeds)")
        # a reward lies in [0, 1]: so does the interval drawn (two seeds' t-interval is far wider)
        ax.fill_between(x, np.clip([c["low"] for c in curves[f]], 0, 1), np.clip([c["high"] for c in curves[f]], 0, 1),
                        color=color, alpha=0.12)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("step")
    ax.set_ylabel("training reward (mean of 16 completions)")
    ax.set_title("GRPO on one agent: drmas vs TRL (95% intervals over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return True


# ---- the command -------------------------------------------------------------------------------------------
def collected(out: Path) -> list[dict]:
    found = [json.loads(p.read_text()) for p in out.glob(f"*-seed*/{RESULT}")]
    return sorted(found, key=lambda r: (r["framework"], r["seed"]))


def same_batch_report(args: argparse.Namespace, overrides: list[str], out: Path) -> None:
    """`grad`: drmas's and TRL's gradients on drmas's first batch of each seed (bench/peer_grad.py), one process
    per seed."""
    from peer_grad import grad_table, same_batch

    runs = []
    for seed in range(args.first_seed, args.first_seed + (args.seeds or 1)):
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            runs.append(pool.submit(same_batch, args.config, seed, overrides, str(out / f"seed{seed}")).result())
    table = grad_table(runs)
    meta = {"what": "grad", "config": args.config, "overrides": overrides, "commit": commit(), "cpus": os.cpu_count()}
    (out / "peer_grad.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    (out / "peer_grad.md").write_text(table + "\n")
    print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("parity", "speed", "grad"))
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--quick", action="store_true", help="the tiny model, 2 steps (2 seeds for parity): it runs")
    parser.add_argument("--seeds", type=int, help="parity: seeds (default 3, quick 2); speed: always 1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, help="steps per run (default: parity 20, speed 6; quick 2)")
    parser.add_argument("--collect", action="store_true", help="run nothing: the report of the runs in OUT")
    parser.add_argument("--frameworks", nargs="+", choices=sorted(RUNNERS),
                        help="run only these (default: parity drmas and trl; speed all three); the report covers "
                             "every run in OUT")
    parser.add_argument("--out", default="runs/peer")
    parser.add_argument("--png", help="parity's plot (default OUT/peer.png)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config, for every run")
    args = parser.parse_intermixed_args()  # overrides may follow the options: `parity --quick a=b`
    parity = args.what == "parity"
    steps = args.steps or (2 if args.quick else 20 if parity else 6)
    seeds = 1 if not parity else args.seeds or (2 if args.quick else 3)
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    frameworks = ("drmas", "trl") if parity else ("drmas", "drmas_async", "trl")
    ran = args.frameworks or frameworks
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.what == "grad":
        return same_batch_report(args, overrides, out)
    start = time.monotonic()
    if not args.collect:
        for seed in range(args.first_seed, args.first_seed + seeds):
            for framework in ran:
                run_one(framework, args.config, seed, steps, overrides, out)
    runs = [r for r in collected(out) if r["framework"] in frameworks]
    if not runs:
        raise SystemExit(f"no run's result in {out} (<framework>-seed<N>/{RESULT})")
    table, summary = (parity_table if parity else speed_table)(runs)
    meta = {"what": args.what, "config": args.config, "overrides": overrides, "quick": args.quick, "steps": steps,
            "wall_s": time.monotonic() - start, "commit": commit(), "cpus": os.cpu_count()}
    name = "peer" if parity else "peer_speed"
    png = Path(args.png or out / f"{name}.png") if parity else None
    write_report({"meta": meta, "summary": summary, "runs": runs}, out, name, table, plot, png)


if __name__ == "__main__":
    main()
