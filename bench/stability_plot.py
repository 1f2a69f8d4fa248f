"""The stability benchmark's picture (docs/stability.png), drawn from the JSON `bench/stability.py` writes.

One column per normalisation mode, side by side, so the same row compares modes at a glance:
row 1 the pre-clip gradient norm of each model per step (one thin line per seed, the seed mean bold),
row 2 E[A^2] per agent per step over the calls whose normalisation set has spread (seed mean; the dotted
lines are what the paper's formula predicts under `global` for the same calls, the grey line is 1),
row 3 the training reward per step (all modes in one panel, 10-step moving average of the seed mean), the
held-out accuracy before and after training per mode, and each agent's calls per step (an agent called only
in some episodes is called less as the others improve), row 4 each agent's own training reward per step per mode
(seed mean, the band its 95% interval over seeds; runs that predate per-agent series leave the row empty).

Needs matplotlib (the `bench` extra, not a dependency of drmas itself); without it `plot` says so in one line
and the benchmark's JSON and table are written all the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Moving average over the last `window` finite values (nan-aware), same length as `values`."""
    out = np.full(values.shape, np.nan)
    for i in range(values.size):
        part = values[max(0, i - window + 1): i + 1]
        part = part[np.isfinite(part)]
        if part.size:
            out[i] = part.mean()
    return out


def _stack(runs: list[dict], *keys: str) -> np.ndarray:
    """Per-step series of the runs (rows = seeds), cut to the shortest run."""
    series = []
    for run in runs:
        value = run["series"]
        for key in keys:
            value = value[key]
        series.append(np.asarray(value, dtype=float))
    length = min(len(s) for s in series)
    return np.vstack([s[:length] for s in series])


def _agent_rewards(row, modes: list[str], runs: list[dict], colours: list[str]) -> None:
    """One panel per agent: its training reward per step under each mode, seed mean with a 95% t-interval band."""
    from learning_stats import t95

    agents = list(runs[0]["series"].get("agent_reward", {}))
    for ax, agent in zip(row, agents):
        for i, mode in enumerate(modes):
            values = _stack([r for r in runs if r["mode"] == mode], "agent_reward", agent)
            steps = np.arange(1, values.shape[1] + 1)
            mean = np.nanmean(values, axis=0)
            ax.plot(steps, mean, color=colours[i], lw=1.4, label=mode)
            if values.shape[0] > 1:
                half = t95(values.shape[0]) * np.nanstd(values, axis=0, ddof=1) / np.sqrt(values.shape[0])
                ax.fill_between(steps, mean - half, mean + half, color=colours[i], alpha=0.15)
        ax.set_title(f"{agent}: own training reward per step (seed mean, 95% CI)")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    for ax in row[len(agents):]:
        ax.axis("off")


def plot(result: dict, png: str | Path) -> bool:
    """Draw the figure to `png`; False (after one line saying how to get matplotlib) when it is not installed."""
    from drmas.runtime.plotting import pyplot

    plt = pyplot(f"the plot {png}")
    if plt is None:
        return False
    modes = list(result["summary"])
    runs = result["runs"]
    fig, axes = plt.subplots(4, len(modes), figsize=(5 * len(modes), 14.5), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    grad_top = 0.0
    for col, mode in enumerate(modes):
        mine = [r for r in runs if r["mode"] == mode]
        ax = axes[0][col]
        for i, model in enumerate(mine[0]["series"]["grad_norm"]):
            grads = _stack(mine, "grad_norm", model)
            steps = np.arange(1, grads.shape[1] + 1)
            for row in grads:
                ax.plot(steps, row, color=colours[i], alpha=0.25, lw=0.7)
            ax.plot(steps, np.nanmean(grads, axis=0), color=colours[i], lw=1.6, label=model)
            grad_top = max(grad_top, float(np.nanmax(grads)))
        ax.set_title(f"{mode}: grad norm per model (pre-clip)")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
        ax = axes[1][col]
        for i, agent in enumerate(mine[0]["series"]["sq_mean"]):
            measured = np.nanmean(_stack(mine, "sq_mean", agent), axis=0)
            formula = np.nanmean(_stack(mine, "global_formula", agent), axis=0)
            steps = np.arange(1, measured.size + 1)
            ax.plot(steps, measured, color=colours[i], lw=1.2, label=f"{agent} ({mode})")
            ax.plot(steps, formula, color=colours[i], lw=1.0, ls=":", label=f"{agent} (global formula)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"{mode}: E[A^2] per agent, sets with spread")
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    for ax in axes[0]:
        ax.set_ylim(0, grad_top * 1.05 if grad_top > 0 else 1)
    ax = axes[2][0]
    for i, mode in enumerate(modes):
        reward = np.nanmean(_stack([r for r in runs if r["mode"] == mode], "reward"), axis=0)
        ax.plot(np.arange(1, reward.size + 1), _smooth(reward, 10), color=colours[i], label=mode)
    ax.set_title("training reward (10-step moving average, seed mean)")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    if len(modes) > 1:
        ax = axes[2][1]
        summary = result["summary"]
        x = np.arange(len(modes))
        for offset, key, label in ((-0.2, "accuracy_before", "before"), (0.2, "accuracy_after", "after")):
            means = [summary[m][key]["mean"] for m in modes]
            spread = [summary[m][key]["std"] for m in modes]
            ax.bar(x + offset, means, width=0.4, yerr=spread, label=label, capsize=3)
        ax.set_xticks(x, modes)
        ax.set_title("held-out accuracy (seed mean ± std)")
        ax.legend(fontsize=8)
    if len(modes) > 2:
        ax = axes[2][2]
        for i, mode in enumerate(modes):
            mine = [r for r in runs if r["mode"] == mode]
            for j, agent in enumerate(mine[0]["series"]["calls"]):
                calls = np.nanmean(_stack(mine, "calls", agent), axis=0)
                ax.plot(np.arange(1, calls.size + 1), _smooth(calls, 10), color=colours[i],
                        ls=("-", "--", ":")[j % 3], label=f"{agent} ({mode})")
        ax.set_title("calls per step per agent (10-step moving average)")
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in axes[2][3:]:
        ax.axis("off")
    _agent_rewards(axes[3], modes, runs, colours)
    meta = result["meta"]
    fig.suptitle(f"{meta['setting']}: {meta['config']}, seeds {meta['seeds']}, {meta['steps']} steps per run")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return True
