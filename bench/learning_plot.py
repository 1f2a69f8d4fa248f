"""The learning benchmark's picture (docs/learning.png), drawn from the JSON `bench/learning.py` writes.

Left: each agent's training reward per step (thin: one line per seed; bold: the seed mean, as a moving
average, because one step holds only a few episodes). Right: held-out accuracy before and after training
per seed with Wilson 95% intervals, so whether the gain clears the noise is read off the same figure.
Needs matplotlib (the `bench` extra); without it `plot` says so in one line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from stability_plot import _smooth


def plot(result: dict, png: str | Path) -> bool:
    """Draw the figure to `png`; False (after one line saying how to get matplotlib) when it is not installed."""
    from drmas.runtime.plotting import pyplot, save

    plt = pyplot(f"the plot {png}")
    if plt is None:
        return False
    runs = result["runs"]
    agents = list(runs[0]["series"]["reward"])
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    steps = min(r["steps"] for r in runs)
    window = max(1, min(10, steps // 6))
    for i, agent in enumerate(agents):
        series = np.vstack([np.asarray(r["series"]["reward"][agent][:steps], dtype=float) for r in runs])
        x = np.arange(1, steps + 1)
        for row in series:
            left.plot(x, row, color=colours[i], alpha=0.2, linewidth=0.8)
        left.plot(x, _smooth(np.nanmean(series, axis=0), window), color=colours[i], linewidth=2,
                  label=f"{agent} (seed mean, {window}-step average)")
    left.set(xlabel="optimizer step", ylabel="training reward per call",
             title=f"per-agent training reward ({len(runs)} seeds)")
    for j, (when, shift) in enumerate((("before", -0.12), ("after", 0.12))):
        acc = np.array([r[when]["accuracy"] for r in runs])
        err = np.array([[a - r[when]["low"], r[when]["high"] - a] for a, r in zip(acc, runs)]).T
        right.errorbar(np.arange(len(runs)) + shift, acc, yerr=err, fmt="o", capsize=4, color=colours[j + len(agents)],
                       label=f"{when} training")
    right.set_xticks(range(len(runs)), [f"seed {r['seed']}" for r in runs])
    right.set(ylabel="held-out accuracy (greedy)", ylim=(0, 1),
              title=f"{runs[0]['before']['n']} held-out problems, 95% Wilson")
    save(plt, fig, (left, right), png)
    return True
