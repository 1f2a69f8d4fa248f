"""Learning benchmark: does RL with drmas raise held-out accuracy beyond noise in ~30 CPU minutes a seed?

Each seed trains a setting (`--setting`; why each: its config's comments and docs/learning.md) in the
single-process loop (drmas.colocated: no sockets, deterministic for a seed) and scores the same held-out problems greedily
before and after training. Per seed it reports the accuracy before and after with Wilson 95% intervals,
the gain with its paired standard error (same problems; the unpaired one too) and the per-agent training
reward per step (metrics.jsonl; the run's TensorBoard holds the same curves as reward/<agent>/mean).
Statistics: `bench/learning_stats.py`; picture: `bench/learning_plot.py`.

    python bench/learning.py --out runs/learning --png docs/learning.png   # full: 3 seeds, one after another
    python bench/learning.py --quick --out runs/learning_quick             # tiny model, 2 x 2 steps, < 60 s
    python bench/learning.py --replot runs/learning [--png docs/learning.png]
    python bench/learning.py --first-seed 2 --seeds 1 --out runs/learning      # one more seed into the same OUT
    python bench/learning.py --collect --out runs/learning                     # the report of the seeds in OUT

Each seed's figures are written to OUT/seed<N>/result.json as soon as it finishes, and the report covers every
seed whose result is in OUT: a run cut off after two seeds keeps them, and seeds run apart add up (give them
the same settings: nothing checks that).

Seeds are `trainer.seed` (problem order, sampling); the model's starting weights are the same for every seed,
so the greedy accuracy before training is too. Extra `key=value` arguments override the config of every run.
Runs go to OUT/seed<N>/ (metrics.jsonl, TensorBoard); the figures to OUT/learning.json and OUT/learning.md
(also printed) and the plot (OUT/learning.png; needs matplotlib, the `bench` extra). A run keeps no
checkpoint (SmolLM2's is 2.2 GB per seed and nothing here reads it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_stats import accuracy, gain  # noqa: E402
from report import add_output_args, commit, replot, write_report  # noqa: E402
from stability_stats import over_seeds  # noqa: E402

# The settings (docs/learning.md): `lookup` (SmolLM2 on bench/lookup.py's task), `sums` (SmolLM2 on sums: a pilot)
SETTINGS = {"lookup": "configs/learning_lookup.yaml", "sums": "configs/learning.yaml"}
# --quick: the same loop and figures on a tiny format-primed model, to check the benchmark runs (not learning)
QUICK = ["models.policy={builtin: tiny, tiny: {hidden_size: 64, num_layers: 2, num_heads: 2, intermediate_size: 128, "
         "seed: 0, prime_steps: 200}, optim: {lr: 1.0e-3}}", "eval.n_problems=8"]
QUICK_SEEDS, QUICK_STEPS = 2, 2
RESULT = "result.json"  # each seed's figures, in its run directory


def seed_results(out: Path) -> list[dict]:
    """Every finished seed's figures in OUT, by seed."""
    found = [json.loads(p.read_text()) for p in out.glob(f"seed*/{RESULT}")]
    return sorted(found, key=lambda r: r["seed"])


class GradingRunner:
    """Stands in for the loop's evaluation runner: runs the real one and keeps each problem's score, per
    evaluation (the request ids start with its tag, `before` or `after`), which the gain's paired standard
    error needs; the loop itself only keeps the mean."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.scores: dict[str, dict] = {}

    def run(self, requests):
        start = time.monotonic()
        results = self.runner.run(requests)
        tag = requests[0].episode_id.split("-", 1)[0] if requests else "none"
        valid: dict[str, list[bool]] = {}
        for r in results:
            for s in r.samples:
                valid.setdefault(s.agent, []).append(s.valid)
        self.scores[tag] = {"uids": [r.request.problem.uid for r in results],
                            "scores": [float(r.outcome.reward) for r in results],
                            "valid": {a: float(np.mean(v)) for a, v in valid.items()},
                            "seconds": time.monotonic() - start}
        return results

    def __getattr__(self, name):
        return getattr(self.runner, name)


def train_one(config: str, seed: int, steps: int | None, overrides: list[str], out: str) -> dict:
    """Train one seed colocated; its held-out scores before and after, and its per-step series."""
    from drmas.assembly import load_config
    from drmas.colocated import ColocatedRun
    from drmas.runtime.metrics import read_metrics

    sets = [f"trainer.steps={steps}"] if steps else []
    cfg = load_config(config, [*overrides, *sets, f"trainer.seed={seed}", f"trainer.output_dir={out}",
                               "trainer.overwrite=true", "logging.progress_bar=false"])
    start, cpu_start = time.monotonic(), time.process_time()
    run = ColocatedRun(cfg, log=lambda line: print(f"[seed {seed}] {line}", flush=True))
    grading = GradingRunner(run.eval_runner)
    run.eval_runner = grading
    run.save = lambda: None  # no checkpoint: see the module docstring
    run.run()
    wall, cpu = time.monotonic() - start, time.process_time() - cpu_start
    if "after" not in grading.scores:
        raise RuntimeError(f"seed {seed} stopped before its evaluation after training (a signal?): no result")
    records = [r for r in read_metrics(Path(out) / "metrics.jsonl") if "episode/reward_mean" in r]
    agents = [a for a, spec in cfg.agents.items() if spec.model]
    before, after = grading.scores["before"], grading.scores["after"]
    if before["uids"] != after["uids"]:
        raise RuntimeError("the evaluations before and after training scored different problems")
    result = {
        "seed": seed, "steps": len(records), "wall_s": wall, "cpu_s": cpu,
        "train_s": float(sum(r.get("time/step_seconds", 0.0) for r in records)),
        "eval_s": {"before": before["seconds"], "after": after["seconds"]},
        "before": accuracy(before["scores"]), "after": accuracy(after["scores"]),
        "gain": gain(before["scores"], after["scores"]),
        "valid": {"before": before["valid"], "after": after["valid"]},
        "scores": {"uids": before["uids"], "before": before["scores"], "after": after["scores"]},
        "series": {
            "reward": {a: [_get(r, f"reward/{a}/mean") for r in records] for a in agents},
            "valid": {a: [_get(r, f"valid/{a}") for r in records] for a in agents},
            "episode_reward": [r["episode/reward_mean"] for r in records],
            "step_seconds": [_get(r, "time/step_seconds") for r in records],
        },
    }
    (Path(out) / RESULT).write_text(json.dumps(result))
    return result


def _get(record: dict, key: str) -> float:
    value = record.get(key)
    return float(value) if value is not None else math.nan


def _window_mean(values: list[float], window: int, last: bool) -> float:
    part = [v for v in (values[-window:] if last else values[:window]) if math.isfinite(v)]
    return float(np.mean(part)) if part else math.nan


def markdown(result: dict) -> str:
    """Per seed: accuracy before and after with intervals, the gain and its SE; per agent: the training
    reward of the first and last steps; then the per-step training reward per agent (mean over seeds)."""
    meta, runs = result["meta"], result["runs"]
    agents = list(runs[0]["series"]["reward"])
    window = max(1, min(10, runs[0]["steps"] // 4))
    lines = [f"config {meta['config']}{' (quick)' if meta['quick'] else ''}, seeds {meta['seeds']}, "
             f"{runs[0]['steps']} steps per run, {runs[0]['before']['n']} held-out problems (greedy, the same before "
             f"and after), wall {meta['wall_s'] / 60:.1f} min, commit {meta['commit'][:10]}",
             "", "| seed | held-out before [95% CI] | after [95% CI] | gain ± paired SE (unpaired SE) | gain / SE "
             "paired (unpaired) | turned right / wrong | wall (min): eval before + steps + eval after | s/step |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        b, a, g = r["before"], r["after"], r["gain"]
        lines.append(f"| {r['seed']} | {_acc(b)} | {_acc(a)} | {g['gain']:+.3f} ± {g['se_paired']:.3f} "
                     f"({g['se_unpaired']:.3f}) | {g['z_paired']:.1f} ({g['z_unpaired']:.1f}) | "
                     f"{g['turned_right']} / {g['turned_wrong']} | {r['wall_s'] / 60:.1f}: {r['eval_s']['before'] / 60:.1f} + "
                     f"{r['train_s'] / 60:.1f} + {r['eval_s']['after'] / 60:.1f} | {r['train_s'] / max(r['steps'], 1):.0f} |")
    lines += ["", f"| seed | agent | training reward, first {window} steps | last {window} steps | valid, first | last |",
              "|---|---|---|---|---|---|"]
    for r in runs:
        for agent in agents:
            rew, val = r["series"]["reward"][agent], r["series"]["valid"][agent]
            lines.append(f"| {r['seed']} | {agent} | {_window_mean(rew, window, False):.3f} | "
                         f"{_window_mean(rew, window, True):.3f} | {_window_mean(val, window, False):.2f} | "
                         f"{_window_mean(val, window, True):.2f} |")
    gains = over_seeds([r["gain"]["gain"] for r in runs])
    lines += ["", f"gain over seeds: {gains['mean']:+.3f} (sample std {gains['std']:.3f}, min {gains['min']:+.3f})",
              "", "training reward per step (mean over seeds; a call's reward is the episode's minus the format "
              "penalty):", "", "| step | " + " | ".join(agents) + " |", "|---|" + "---|" * len(agents)]
    steps = min(r["steps"] for r in runs)
    for i in range(steps):
        cells = [np.nanmean([r["series"]["reward"][a][i] for r in runs]) for a in agents]
        lines.append(f"| {i + 1} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def _acc(stat: dict) -> str:
    return f"{stat['accuracy']:.3f} [{stat['low']:.3f}, {stat['high']:.3f}]"


def write_outputs(result: dict, out: Path, png: Path | None) -> None:
    from learning_plot import plot

    write_report(result, out, "learning", markdown(result), plot, png)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="lookup",
                        help="lookup: SmolLM2 on bench/lookup.py's task (default); sums: SmolLM2 on sums (a pilot)")
    parser.add_argument("--config", help="a config of your own (default: the setting's)")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 seeds x 2 steps: checks the bench runs")
    parser.add_argument("--seeds", type=int, help="number of seeds (default 3, quick 2)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0: seeds 0..N-1)")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: the config's)")
    parser.add_argument("--collect", action="store_true", help="train nothing: the report of the seeds already "
                        "in OUT (those of an invocation that was stopped, say)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at the same time (default 1: each run uses "
                        "trainer.threads cores)")
    add_output_args(parser, "learning")
    args = parser.parse_args()
    if replot(args, "learning", write_outputs):
        return
    seeds = args.seeds or (QUICK_SEEDS if args.quick else 3)
    steps = args.steps or (QUICK_STEPS if args.quick else None)
    config = args.config or SETTINGS[args.setting]
    overrides = [*(QUICK if args.quick else []), *args.overrides]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    first = args.first_seed
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futures = {seed: pool.submit(train_one, config, seed, steps, overrides, str(out / f"seed{seed}"))
                   for seed in ([] if args.collect else range(first, first + seeds))}
        for seed, future in futures.items():
            run = future.result()
            g = run["gain"]
            print(f"done seed {seed}: {run['before']['accuracy']:.3f} -> {run['after']['accuracy']:.3f} "
                  f"(gain {g['gain']:+.3f} ± {g['se_paired']:.3f}) in {run['wall_s']:.0f} s", flush=True)
    runs = seed_results(out)  # this invocation's seeds and any an earlier one left in OUT
    if not runs:
        raise SystemExit(f"no seed's result in {out} (seed<N>/{RESULT})")
    meta = {"config": config, "seeds": [r["seed"] for r in runs], "overrides": overrides, "quick": args.quick,
            "jobs": args.jobs, "wall_s": max(r["wall_s"] for r in runs) if args.collect else time.monotonic() - start, "cpu_s": sum(r["cpu_s"] for r in runs),
            "commit": commit(), "cpus": os.cpu_count()}
    write_outputs({"meta": meta, "runs": runs}, out, Path(args.png or out / "learning.png"))


if __name__ == "__main__":
    main()
