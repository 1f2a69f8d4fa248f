"""The staleness of an asynchronous run, from its metrics: numbers on the console, and a picture next to the run.

Reads `<run>/learner-*/metrics.jsonl` and `<run>/buffer/metrics.jsonl` (the same records TensorBoard shows)
and prints, per learner step, the version lag of the consumed samples per agent (mean and max, against the
bound `pipeline.max_staleness`) and the learner's idle share, and the buffer's deepest queue per agent. With
matplotlib (the `bench` extra) it also draws them, by default to `<run>/staleness.png`:

    python docs/plot_staleness.py runs/smoke_async                 # -> runs/smoke_async/staleness.png
    python docs/plot_staleness.py runs/smoke_async --out docs/staleness.png   # the picture of docs/pipeline.md
"""

from __future__ import annotations

from pathlib import Path

import yaml

from drmas.runtime.metrics import read_metrics
from drmas.runtime.plotting import pyplot, run_and_picture, save


def learner_series(run: Path) -> dict[str, dict]:
    """model -> {"steps", "idle", "lag": {agent: (means, maxes)}} from each learner's metrics.jsonl."""
    out = {}
    for metrics in sorted(run.glob("learner-*/metrics.jsonl")):
        model = metrics.parent.name.removeprefix("learner-")
        records = [r for r in read_metrics(metrics) if f"idle/{model}" in r]
        agents = sorted({k.split("/")[1] for r in records for k in r if k.startswith("staleness/") and k.endswith("/mean")})
        out[model] = {"steps": [r["step"] for r in records], "idle": [r.get(f"idle/{model}") for r in records],
                      "lag": {a: ([r.get(f"staleness/{a}/mean") for r in records],
                                  [r.get(f"staleness/{a}/max") for r in records]) for a in agents}}
    return out


def buffer_depths(run: Path) -> tuple[list[float], dict[str, list[float]]]:
    """(seconds since the first record, {depth key: values}) of the buffer's metrics."""
    path = run / "buffer" / "metrics.jsonl"
    records = read_metrics(path) if path.exists() else []
    if not records:
        return [], {}
    t0 = records[0]["time"]
    keys = sorted({k for r in records for k in r if k.startswith("buffer/") and k.endswith("/depth")})
    return [r["time"] - t0 for r in records], {k: [r.get(k, 0) for r in records] for k in keys}


def _cell(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(learners: dict[str, dict], depths: dict[str, list[float]], bound: int) -> str:
    """The figures as text: one line per learner step, then the buffer's deepest queues."""
    lines = [f"version lag of consumed samples (bound pipeline.max_staleness={bound}) and learner idle share"]
    for model, series in learners.items():
        agents = list(series["lag"])
        lines.append(f"learner {model}: step | " + " | ".join(f"{a} lag mean/max" for a in agents) + " | idle")
        for i, step in enumerate(series["steps"]):
            lags = " | ".join(f"{_cell(series['lag'][a][0][i])} / {_cell(series['lag'][a][1][i])}" for a in agents)
            lines.append(f"  {step:>4} | {lags} | {_cell(series['idle'][i])}")
    for key, values in depths.items():
        lines.append(f"{key}: at most {max(values):g} queued groups")
    return "\n".join(lines)


def draw(learners: dict[str, dict], seconds: list[float], depths: dict[str, list[float]], bound: int,
         png: Path) -> bool:
    plt = pyplot(f"the plot {png}")
    if plt is None:
        return False
    fig, (lag, depth, idle) = plt.subplots(1, 3, figsize=(13, 3.6))
    for model, series in learners.items():
        for agent, (means, maxes) in series["lag"].items():
            line, = lag.plot(series["steps"], means, marker="o", label=f"{agent} mean")
            lag.plot(series["steps"], maxes, ls="--", color=line.get_color(), label=f"{agent} max")
        idle.plot(series["steps"], series["idle"], marker="o", label=f"learner {model}")
    lag.axhline(bound, color="black", lw=0.8, ls=":", label=f"bound ({bound})")
    lag.set(title="staleness/<agent> (version lag)", xlabel="learner step", ylabel="versions")
    for key, values in depths.items():
        depth.plot(seconds, values, label=key)
    depth.set(title="buffer/<agent>/depth (queued groups)", xlabel="seconds", ylabel="groups")
    idle.set(title="idle/<model> (share of step waiting)", xlabel="learner step", ylim=(0, 1))
    save(plt, fig, (lag, depth, idle), png)
    return True


def main() -> None:
    run, png = run_and_picture(__doc__.splitlines()[0], "trainer.output_dir of an async run", "staleness.png")
    bound = yaml.safe_load((run / "config.yaml").read_text())["pipeline"]["max_staleness"]
    learners = learner_series(run)
    seconds, depths = buffer_depths(run)
    print(table(learners, depths, bound))
    if draw(learners, seconds, depths, bound, png):
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
