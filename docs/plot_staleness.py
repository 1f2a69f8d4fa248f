"""Draw the staleness panel of the README from a real asynchronous run's metrics.

Reads `<run>/learner-*/metrics.jsonl` and `<run>/buffer/metrics.jsonl` (the same records TensorBoard
shows) and writes one PNG with, per step: the version lag of consumed samples per agent (mean and max,
with the bound), the buffer depth per agent, and the learner's idle share.

    python docs/plot_staleness.py runs/smoke_async --out docs/staleness.png

Needs matplotlib (`pip install matplotlib`; not a dependency of drmas itself).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from drmas.runtime.metrics import read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="trainer.output_dir of an async run")
    parser.add_argument("--out", default="docs/staleness.png")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(args.run)
    bound = yaml.safe_load((run / "config.yaml").read_text())["pipeline"]["max_staleness"]
    fig, (lag, depth, idle) = plt.subplots(1, 3, figsize=(13, 3.6))
    for metrics in sorted(run.glob("learner-*/metrics.jsonl")):
        model = metrics.parent.name.removeprefix("learner-")
        records = read_metrics(metrics)
        steps = [r["step"] for r in records]
        agents = sorted({k.split("/")[1] for r in records for k in r if k.startswith("staleness/") and k.endswith("/mean")})
        for agent in agents:
            line, = lag.plot(steps, [r.get(f"staleness/{agent}/mean") for r in records], marker="o",
                             label=f"{agent} mean")
            lag.plot(steps, [r.get(f"staleness/{agent}/max") for r in records], ls="--", color=line.get_color(),
                     label=f"{agent} max")
        idle.plot(steps, [r.get(f"idle/{model}") for r in records], marker="o", label=f"learner {model}")
    lag.axhline(bound, color="black", lw=0.8, ls=":", label=f"bound ({bound})")
    lag.set(title="staleness/<agent> (version lag)", xlabel="learner step", ylabel="versions")
    buffer = read_metrics(run / "buffer" / "metrics.jsonl")
    t0 = buffer[0]["time"]
    for key in sorted({k for r in buffer for k in r if k.startswith("buffer/") and k.endswith("/depth")}):
        depth.plot([r["time"] - t0 for r in buffer], [r.get(key, 0) for r in buffer], label=key)
    depth.set(title="buffer/<agent>/depth (queued groups)", xlabel="seconds", ylabel="groups")
    idle.set(title="idle/<model> (share of step waiting)", xlabel="learner step", ylim=(0, 1))
    for ax in (lag, depth, idle):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
