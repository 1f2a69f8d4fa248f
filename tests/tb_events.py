"""Reading TensorBoard event files back in tests: what a user would see in TensorBoard, tag by tag."""

from __future__ import annotations

from pathlib import Path


def tensorboard_scalars(tensorboard_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of every scalar in the event files under `tensorboard_dir`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tensorboard_dir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
