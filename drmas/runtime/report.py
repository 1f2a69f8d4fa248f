"""The end-of-run summary table (rich): per-agent advantage scale and running reward statistics, per-model
gradient-norm stability, held-out accuracy before and after training."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_summary(summary: dict, cfg) -> None:
    console = Console()
    table = Table(title=f"drmas run: {summary['steps']} steps, estimator={cfg.algorithm.chosen_estimator}, loss={cfg.algorithm.loss}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for agent in cfg.agents:
        key = f"advantage/{agent}/sq_mean"
        if key in summary:
            table.add_row(f"mean A^2 ({agent})", f"{summary[key]:.3f}")
    for agent, stats in summary.get("reward_stats", {}).items():
        table.add_row(f"running reward ({agent}) mean / std / count",
                      f"{stats['mean']:.3f} / {stats['std']:.3f} / {int(stats['count'])}")
    for key, stats in summary.items():
        if key.startswith("grad_norm/"):
            table.add_row(f"{key} median / max / spikes>3x", f"{stats['median']:.3f} / {stats['max']:.3f} / {int(stats['spikes'])}")
    acc = summary.get("accuracy", {})
    for when in ("before", "after"):
        if when in acc:
            table.add_row(f"held-out accuracy (final answer) {when}", f"{acc[when]:.3f}")
    console.print(table)
    if "before" in acc and "after" in acc:
        print(f"held-out accuracy: before {acc['before']:.3f} -> after {acc['after']:.3f}")
