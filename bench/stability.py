"""Training stability of advantage estimators: agent-wise (Dr. MAS) vs global (GRPO) vs step-level global, or any.

The paper's claim: under one global baseline, agent k's advantages have the second moment
E[A_k^2] = (sigma_k^2 + (mu_k - mu)^2) / sigma^2 instead of about 1, which inflates that agent's gradient
and makes gradient norms spike; agent-wise normalisation keeps both tame. This benchmark trains the same
config with the same seeds under `agent`, `global` and `step_global` in the single-process loop
(drmas.colocated: deterministic, no sockets) and reports, per mode (mean and spread over seeds):
- per agent: mu_k and sigma_k of the call rewards; E[A^2] measured over the calls whose normalisation set
  has spread (non-zero std); what the formula predicts for `global` on the same calls (with its spread and
  offset terms); E[A^2] over all calls as trained (singletons and constant sets included);
- per model: grad-norm (pre-clip) median, max and share of steps above 3x the running median;
- the training reward curve and held-out accuracy before and after training.
Statistics are defined in `bench/stability_stats.py`; the picture is drawn by `bench/stability_plot.py`.

The setting (`configs/stability.yaml`, "tiny"): the math_revise system (drmas/mas/revise.py), a solver and
a reviser on separate tiny format-primed models with one optimiser each; the reviser is called only when
the task's checker finds the solver's answer wrong, so its calls' reward distribution differs from the
solver's by construction. The math system (solver + verifier) was tried first and does not give this with
tiny models: a 15-step pilot with separate models, 3 rounds, measured equal reward levels for both agents
(global E[A^2] 0.748 / 0.745, offset terms <= 0.03): an untrained verifier's verdict is unrelated to
correctness and approves ~97% of answers. Sums of two numbers 1..6 keep answers in the range the tiny
models were primed to write, so rewards vary within groups. Seeds are `trainer.seed` (problem order,
sampling, initial RNG); the two tiny models' weights are the same for every seed. "smollm2" is the same
workflow with SmolLM2-135M-Instruct as both models (two copies, two optimisers): a shorter real-model run.
"debate" (`configs/stability_debate.yaml`) is the debate example system (examples/debate, a plugin): two
solvers on one tiny model, each rewarded by its own final answer, and a judge on another, rewarded by the answer
it picks (per-agent rewards that differ by construction: `EpisodeOutcome.agent_rewards`). "lookup_credit"
(`configs/stability_lookup.yaml`, issue 34 part 2) is where the mechanism must show: SmolLM2-135M-Instruct as a
solver and a verifier (own copies, own optimisers) on bench/lookup.py's task, the solver rewarded 0/1 by its answer
and the verifier 0/0.1 by whether its verdict matches that answer's correctness (rewards on different scales by
construction; the E[A^2] each mode must give is in docs/stability.md, computed before any run).

    python bench/stability.py --quick --out runs/stability_quick            # < 5 min on 2 cores
    python bench/stability.py --out runs/stability --png docs/stability.png  # full: 3 seeds x 120 steps x 3 modes
    python bench/stability.py --setting smollm2 --out runs/stability_smollm2   # 1 seed x 5 steps x 3 modes
    python bench/stability.py --setting debate --quick --out runs/stability_debate_quick   # per-agent rewards
    python bench/stability.py --setting lookup_credit --out runs/stability_lookup   # 3 seeds x 20 steps, ~3 h
    python bench/stability.py --quick --estimators all --out runs/stability_all   # every registered estimator
    python bench/stability.py --replot runs/stability [--png docs/stability.png]   # table + plot from the JSON

`--estimators a,b,c` (or `all`) trains any registered estimators (docs/algorithms.md; a plugin's too, with
`plugins=[...]` among the overrides); the default is the paper's three. "Sets with spread" are the sets an
estimator centres on: group x agent for agent and agent_rloo, the group's calls for step_global, the group's
episodes for the episode-level ones (global, rloo, dr_grpo, batch) and for a plugin's.

Extra `key=value` arguments override the config of every run. Runs go to OUT/<mode>/seed<N>/ (metrics.jsonl,
TensorBoard, and the run's figures in run.json as soon as it finishes, so a long setting can be run a seed at a time:
`--first-seed 1 --seeds 1` adds seed 1 to OUT, and the report covers every run OUT holds of the estimators asked
for; `--collect` trains nothing and reports them); the figures to OUT/stability.json and OUT/stability.md (also printed) and the plot (OUT/stability.png;
needs matplotlib, the `bench` extra: without it the figures still come out, and one line says how to get it).
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
from report import add_output_args, commit, replot, write_report  # noqa: E402
from stability_stats import measured_second_moment, over_seeds, predicted_second_moment, set_view, spike_share  # noqa: E402

MODES = ("agent", "global", "step_global")
RUN_FIGURES = "run.json"  # one run's figures, in its run directory
# the normalisation sets whose spread `measured_second_moment` requires, per built-in estimator (others: global's)
SET_FAMILY = {"agent": "agent", "agent_rloo": "agent", "step_global": "step_global"}
SETTINGS = {
    "tiny": {"config": "configs/stability.yaml", "seeds": 3, "steps": 120, "quick_seeds": 2, "quick_steps": 12,
             "jobs": 2},
    # one run at a time: a SmolLM2 run (two models, their engines and optimisers) holds ~12 GB at its peak
    "smollm2": {"config": "configs/stability_smollm2.yaml", "seeds": 1, "steps": 5, "quick_seeds": 1,
                "quick_steps": 2, "jobs": 1},
    # per-agent rewards by construction: the debate example's solvers (own answers) vs its judge (the pick)
    "debate": {"config": "configs/stability_debate.yaml", "seeds": 3, "steps": 120, "quick_seeds": 2, "quick_steps": 12,
               "jobs": 2},
    # rewards on different scales (solver 0/1, verifier 0/0.1); two SmolLM2 copies a run, ~6 GB: two runs fit
    "lookup_credit": {"config": "configs/stability_lookup.yaml", "seeds": 3, "steps": 20, "quick_seeds": 1,
                      "quick_steps": 2, "jobs": 2},
}


class RecordingRunner:
    """Stands in for the loop's episode runner: runs the real one and keeps each step's calls, which is all the
    statistics need; the loop itself is unchanged."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.steps: list[list] = []  # per step: its samples

    def run(self, requests):
        results = self.runner.run(requests)
        self.steps.append([s for r in results for s in r.samples])
        return results

    def __getattr__(self, name):
        return getattr(self.runner, name)


def second_moments(mode: str, steps: list[list]) -> dict[str, dict]:
    """Per agent: E[A^2] of estimator `mode`'s advantages over calls in sets with spread (each step estimated
    as the loop estimates it, without running statistics, which sets with spread never use), and the global
    formula."""
    from drmas.algorithms import AdvantageBatch, estimate
    from drmas.algorithms.running_stats import AgentRewardStats
    from drmas.config.schema import AlgorithmConfig

    alg = AlgorithmConfig(estimator=mode)
    adv = np.concatenate([estimate(AdvantageBatch.from_samples(step), alg, AgentRewardStats()) for step in steps])
    calls = [s for step in steps for s in step]
    args = ([float(s.reward) for s in calls], [s.group_id for s in calls], [s.agent for s in calls],
            [s.episode_id for s in calls])
    measured = measured_second_moment(adv, args[2], set_view(SET_FAMILY.get(mode, "global"), *args))
    predicted = predicted_second_moment(args[2], set_view("global", *args))
    return {a: {**predicted[a], "measured": measured[a]["sq_mean"], "measured_calls": measured[a]["calls"]}
            for a in measured}


def train_one(config: str, mode: str, seed: int, steps: int, overrides: list[str], out: str) -> dict:
    """Train one (mode, seed) run colocated and return its figures and per-step series."""
    from drmas.assembly import load_config  # imports the config's plugins (the debate setting's system)
    from drmas.colocated import ColocatedRun
    from drmas.runtime.metrics import read_metrics

    cfg = load_config(config, [*overrides, f"algorithm.estimator={mode}", f"trainer.seed={seed}",
                               f"trainer.steps={steps}", f"trainer.output_dir={out}", "trainer.overwrite=true",
                               "logging.progress_bar=false", "logging.console_every=0"])
    start, cpu_start = time.monotonic(), time.process_time()
    run = ColocatedRun(cfg, log=lambda *_: None)
    recorder = RecordingRunner(run.runner)
    run.runner = recorder
    summary = run.run()
    wall, cpu = time.monotonic() - start, time.process_time() - cpu_start
    records = [r for r in read_metrics(Path(out) / "metrics.jsonl") if "episode/reward_mean" in r]
    agents, models = list(cfg.agents), list(run.trainers)
    calls = [s for step in recorder.steps for s in step]
    per_step = [second_moments(mode, [step]) for step in recorder.steps]
    rewards = np.asarray([float(s.reward) for s in calls])
    who = np.asarray([s.agent for s in calls])
    moments = second_moments(mode, recorder.steps)
    return {
        "mode": mode, "seed": seed, "steps": len(records), "wall_s": wall, "cpu_s": cpu,
        "accuracy": summary.get("accuracy", {}),
        "heldout": summary.get("heldout", {}),
        "agents": {a: {"mu": float(rewards[who == a].mean()), "sigma": float(rewards[who == a].std()),
                       "calls_per_step": float((who == a).sum() / max(len(records), 1)),
                       **moments.get(a, {}),
                       "sq_mean_all_calls": _mean([r.get(f"advantage/{a}/sq_mean") for r in records])}
                   for a in agents},
        "models": {m: spike_share([_finite(r.get(f"grad_norm/{m}")) for r in records]) for m in models},
        "series": {
            "reward": [r["episode/reward_mean"] for r in records],
            "agent_reward": {a: [_finite(r.get(f"reward/{a}/mean")) for r in records] for a in agents},
            "valid": {a: [_finite(r.get(f"valid/{a}")) for r in records] for a in agents},
            "calls": {a: [float(sum(s.agent == a for s in step)) for step in recorder.steps] for a in agents},
            "grad_norm": {m: [_finite(r.get(f"grad_norm/{m}")) for r in records] for m in models},
            "sq_mean": {a: [s.get(a, {}).get("measured", math.nan) for s in per_step] for a in agents},
            "global_formula": {a: [s.get(a, {}).get("predicted", math.nan) for s in per_step] for a in agents},
        },
    }


def _finite(value) -> float:
    return float(value) if value is not None else math.nan


def _mean(values) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(vals)) if vals else math.nan


def aggregate(runs: list[dict]) -> dict:
    """Mean and spread over seeds of every figure, per mode (agent and model figures per agent / model)."""
    out: dict[str, dict] = {}
    for mode in dict.fromkeys(r["mode"] for r in runs):
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        first = mine[0]
        tail = max(1, min(20, first["steps"] // 5))
        out[mode] = {
            "seeds": [r["seed"] for r in mine],
            "agents": {a: {k: over_seeds([r["agents"][a].get(k, math.nan) for r in mine])
                           for k in ("mu", "sigma", "calls_per_step", "measured", "predicted", "spread_term",
                                     "offset_term", "sq_mean_all_calls")} for a in first["agents"]},
            "models": {m: {k: over_seeds([r["models"][m][k] for r in mine]) for k in ("median", "max", "spike_share")}
                       for m in first["models"]},
            "reward_first": over_seeds([_mean(r["series"]["reward"][:tail]) for r in mine]),
            "reward_last": over_seeds([_mean(r["series"]["reward"][-tail:]) for r in mine]),
            "reward_window": tail,
            "agent_reward": {a: {"first": over_seeds([_mean(r["series"].get("agent_reward", {}).get(a, [])[:tail])
                                                      for r in mine]),
                                 "last": over_seeds([_mean(r["series"].get("agent_reward", {}).get(a, [])[-tail:])
                                                     for r in mine])} for a in first["agents"]},
            "heldout_info": {key: {tag: over_seeds([r.get("heldout", {}).get(tag, {}).get(key, math.nan) for r in mine])
                                   for tag in ("before", "after")}
                             for key in sorted({k for r in mine for rep in r.get("heldout", {}).values() for k in rep
                                                if k.startswith(("info/", "valid/"))})},
            "accuracy_before": over_seeds([r["accuracy"].get("before", math.nan) for r in mine]),
            "accuracy_after": over_seeds([r["accuracy"].get("after", math.nan) for r in mine]),
            "wall_s": over_seeds([r["wall_s"] for r in mine]),
            "cpu_s": over_seeds([r.get("cpu_s", math.nan) for r in mine]),
        }
    return out


def _cell(stat: dict, digits: int = 3) -> str:
    if not stat or stat.get("n", 0) == 0:
        return "n/a"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}" if stat["n"] > 1 else f"{stat['mean']:.{digits}f}"


def markdown(result: dict) -> str:
    """The three tables of the report: per agent, per model, per mode."""
    agg, meta = result["summary"], result["meta"]
    lines = [f"setting `{meta['setting']}` ({meta['config']}), seeds {meta['seeds']}, {meta['steps']} steps per run, "
             f"wall {meta['wall_s'] / 60:.1f} min ({meta['jobs']} runs at a time; CPU time of all runs "
             f"{meta.get('cpu_s', math.nan) / 60:.1f} min), commit {meta['commit'][:10]}",
             "", "| mode | agent | mu_k | sigma_k | calls/step | E[A^2] measured (sets with spread) | "
             "global formula (spread + offset) | E[A^2] all calls |", "|---|---|---|---|---|---|---|---|"]
    for mode, m in agg.items():
        for agent, a in m["agents"].items():
            formula = f"{_cell(a['predicted'])} ({_cell(a['spread_term'], 2)} + {_cell(a['offset_term'], 2)})"
            lines.append(f"| `{mode}` | {agent} | {_cell(a['mu'])} | {_cell(a['sigma'])} | {_cell(a['calls_per_step'], 1)} "
                         f"| {_cell(a['measured'])} | {formula} | {_cell(a['sq_mean_all_calls'])} |")
    lines += ["", "| mode | model | grad norm median | grad norm max | share of steps > 3x running median |",
              "|---|---|---|---|---|"]
    for mode, m in agg.items():
        for model, g in m["models"].items():
            lines.append(f"| `{mode}` | {model} | {_cell(g['median'])} | {_cell(g['max'])} | {_cell(g['spike_share'])} |")
    lines += ["", "| mode | train reward, first steps | train reward, last steps | held-out acc. before | after | wall per run (s) | CPU per run (s) |",
              "|---|---|---|---|---|---|---|"]
    for mode, m in agg.items():
        lines.append(f"| `{mode}` | {_cell(m['reward_first'])} | {_cell(m['reward_last'])} | {_cell(m['accuracy_before'])} "
                     f"| {_cell(m['accuracy_after'])} | {_cell(m['wall_s'], 0)} | {_cell(m.get('cpu_s', {}), 0)} |")
    lines += ["", "| mode | agent | reward, first steps | reward, last steps |", "|---|---|---|---|"]
    for mode, m in agg.items():
        for agent, r in m.get("agent_reward", {}).items():
            lines.append(f"| `{mode}` | {agent} | {_cell(r['first'])} | {_cell(r['last'])} |")
    if any(m.get("heldout_info") for m in agg.values()):
        lines += ["", "| mode | held-out figure | before | after |", "|---|---|---|---|"]
        for mode, m in agg.items():
            for key, tags in m.get("heldout_info", {}).items():
                lines.append(f"| `{mode}` | {key} | {_cell(tags['before'])} | {_cell(tags['after'])} |")
    lines.append(f"\n(first/last steps = mean episode reward over the first/last {next(iter(agg.values()))['reward_window']} "
                 "steps; mean ± sample std over seeds)")
    return "\n".join(lines)


def write_outputs(result: dict, out: Path, png: Path | None) -> None:
    from stability_plot import plot

    write_report(result, out, "stability", markdown(result), plot, png)


def saved_runs(out: Path, modes: list[str]) -> list[dict]:
    """The figures of every run OUT holds for `modes`, mode by mode in `modes`' order, seeds ascending."""
    runs = []
    for mode in modes:
        found = [json.loads(f.read_text()) for f in (out / mode).glob(f"seed*/{RUN_FIGURES}")]
        runs += sorted(found, key=lambda r: r["seed"])
    return runs


def estimators(spec: str, config: str, overrides: list[str]) -> list[str]:
    """The estimators `--estimators` names, each checked against the registry (the config's plugins imported)."""
    from drmas.algorithms import ADVANTAGE_ESTIMATORS
    from drmas.assembly import load_plugins

    load_plugins(config, overrides)
    names = ADVANTAGE_ESTIMATORS.names() if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    problems = [p for n in names if (p := ADVANTAGE_ESTIMATORS.problem(n, "--estimators"))]
    if problems or not names:
        raise SystemExit("\n".join(problems) or "--estimators: name at least one estimator")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="tiny")
    parser.add_argument("--config", help="config file (default: the setting's)")
    parser.add_argument("--quick", action="store_true", help="fewer seeds and steps, same figures")
    parser.add_argument("--seeds", type=int, help="number of seeds (FIRST..FIRST+N-1)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--collect", action="store_true", help="train nothing: the report of the runs already in OUT")
    parser.add_argument("--steps", type=int, help="optimizer steps per run")
    parser.add_argument("--estimators", "--modes", dest="estimators", default=",".join(MODES),
                        help="registered advantage estimators to train, comma-separated, or 'all' (default: %(default)s)")
    parser.add_argument("--jobs", type=int, help="runs trained at the same time, one process each (default: the "
                        "setting's, 2 for tiny, 1 for smollm2)")
    add_output_args(parser, "stability")
    args = parser.parse_args()
    if replot(args, "stability", write_outputs):
        return
    setting = SETTINGS[args.setting]
    seeds = args.seeds or setting["quick_seeds" if args.quick else "seeds"]
    steps = args.steps or setting["quick_steps" if args.quick else "steps"]
    config = args.config or setting["config"]
    n_jobs = args.jobs or setting["jobs"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = estimators(args.estimators, config, args.overrides)
    jobs = [(config, mode, seed, steps, args.overrides, str(out / mode / f"seed{seed}"))
            for seed in range(args.first_seed, args.first_seed + seeds) for mode in modes] if not args.collect else []
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, n_jobs), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(train_one, *job) for job in jobs]
        for job, future in zip(jobs, futures):
            run = future.result()
            (Path(job[5]) / RUN_FIGURES).write_text(json.dumps(run))
            print(f"done {job[1]} seed {job[2]}: {run['wall_s']:.0f} s", flush=True)
    runs = saved_runs(out, modes)  # this invocation's and any an earlier one left in OUT
    if not runs:
        raise SystemExit(f"no run's figures in {out} (<estimator>/seed<N>/{RUN_FIGURES})")
    meta = {"setting": args.setting, "config": config, "seeds": sorted({r["seed"] for r in runs}),
            "steps": max(r["steps"] for r in runs), "overrides": args.overrides, "quick": args.quick, "jobs": n_jobs,
            "wall_s": sum(r["wall_s"] for r in runs) / n_jobs if args.collect else time.monotonic() - start,
            "cpu_s": sum(r["cpu_s"] for r in runs), "commit": commit(), "cpus": os.cpu_count()}
    write_outputs({"meta": meta, "summary": aggregate(runs), "runs": runs}, out, Path(args.png or out / "stability.png"))


if __name__ == "__main__":
    main()
