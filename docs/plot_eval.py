"""The `eval/` curves of a run (eval.interval), read from its TensorBoard event files: numbers, then a picture.

Reads the scalars TensorBoard shows under `eval/` (`<run>/eval/tensorboard` of an asynchronous run,
`<run>/tensorboard` of a colocated one), prints them per version, and with matplotlib (the `bench` extra)
draws avg@k / pass@k per benchmark and the per-agent statistics (valid share per agent, and how often the
verifier approved a wrong answer, `on_failures/approved`), by default to `<run>/eval.png`:

    python docs/plot_eval.py runs/quickstart                       # -> runs/quickstart/eval.png
    python docs/plot_eval.py runs/quickstart --out docs/eval.png   # the picture of the README
"""

from __future__ import annotations

from pathlib import Path

from drmas.runtime.plotting import pyplot, run_and_picture, save

Series = dict[str, list[tuple[int, float]]]


def eval_scalars(run: Path) -> Series:
    """{tag: [(version, value), ...]} of every `eval/<benchmark>/...` scalar in the run's event files (the
    launcher's `eval/accuracy_before|after` are single points of another measure, left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    directory = run / "eval" / "tensorboard" if (run / "eval" / "tensorboard").is_dir() else run / "tensorboard"
    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
            if tag.startswith("eval/") and not tag.startswith("eval/accuracy_")}


def _picked(scalars: Series) -> tuple[Series, Series]:
    """(scores: avg@k / pass@k per benchmark, behaviour: valid share per agent and approvals of wrong answers)."""
    scores = {tag: points for tag, points in scalars.items() if tag.endswith(("/avg@k", "/pass@k"))}
    behaviour = {tag: points for tag, points in scalars.items()
                 if "/valid/" in tag or tag.endswith("/on_failures/approved")}
    return scores, behaviour


def table(scalars: Series) -> str:
    scores, behaviour = _picked(scalars)
    tags = list(scores) + list(behaviour)
    versions = sorted({step for tag in tags for step, _ in scalars[tag]})
    lines = ["version | " + " | ".join(tag.removeprefix("eval/") for tag in tags)]
    for version in versions:
        cells = [dict(scalars[tag]).get(version) for tag in tags]
        lines.append(f"{version:>7} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells))
    return "\n".join(lines)


def draw(scalars: Series, png: Path, title: str) -> bool:
    plt = pyplot(f"the plot {png}")
    if plt is None:
        return False
    scores, behaviour = _picked(scalars)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for tag, points in scores.items():
        left.plot(*zip(*points), marker="o", ls="-" if tag.endswith("avg@k") else "--", label=tag)
    left.set(title="avg@k and pass@k per benchmark", xlabel="version (learner step)", ylim=(-0.02, 1.02))
    for tag, points in behaviour.items():
        right.plot(*zip(*points), marker="o", label=tag)
    right.set(title="per agent: valid share; verifier approvals of wrong answers", xlabel="version (learner step)",
              ylim=(-0.02, 1.02))
    fig.suptitle(title, fontsize=9)
    save(plt, fig, (left, right), png)
    return True


def main() -> None:
    run, png = run_and_picture(__doc__.splitlines()[0], "trainer.output_dir of a run with eval.interval set",
                               "eval.png")
    scalars = eval_scalars(run)
    if not scalars:
        raise SystemExit(f"{run}: no eval/ scalars in its TensorBoard event files (was eval.interval set?)")
    print(table(scalars))
    if draw(scalars, png, f"TensorBoard eval/ of {run.name}"):
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
