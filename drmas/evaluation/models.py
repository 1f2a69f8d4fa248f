"""Which model directory `drmas eval` serves for each configured model.

A run's checkpoint (`<output_dir>/checkpoints/step_<N>/`) holds one Hugging Face directory per *trained*
model; frozen models (and trainable ones no agent trains) are never saved there, because they never
change. So a model is taken from the checkpoint when its directory is there, from its config when it
could not have been saved, and a trained model missing from the checkpoint is an error: silently
evaluating its initial weights would report the untrained system under the checkpoint's name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from drmas import assembly
from drmas.config.schema import DrmasConfig

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_step(checkpoint: Optional[Path]) -> int:
    """The training step of a checkpoint directory (`step_<N>`, else its COMPLETE marker), 0 for none."""
    if checkpoint is None:
        return 0
    match = _STEP_DIR.match(checkpoint.name)
    if match:
        return int(match.group(1))
    marker = checkpoint / "COMPLETE"
    if marker.is_file() and marker.read_text().strip().isdigit():
        return int(marker.read_text().strip())
    return 0


def check_checkpoint_dir(checkpoint: Path) -> None:
    """FileNotFoundError when `checkpoint` is not a directory; ValueError for a run checkpoint whose save
    was interrupted (trainer state present but no COMPLETE marker: its weights may be torn)."""
    if not checkpoint.is_dir():
        raise FileNotFoundError(
            f"checkpoint directory {str(checkpoint)!r} does not exist "
            "(expected a run's <output_dir>/checkpoints/step_<N> directory)"
        )
    if (checkpoint / "trainer_state").is_dir() and not (checkpoint / "COMPLETE").exists():
        raise ValueError(
            f"checkpoint {str(checkpoint)!r} has no COMPLETE marker: its save was interrupted; "
            "evaluate an earlier complete checkpoint"
        )


def eval_model_dirs(cfg: DrmasConfig, checkpoint: Optional[Path]) -> dict[str, Path]:
    """Model id -> HF directory to serve. Without a checkpoint every model comes from its config."""
    if checkpoint is None:
        return {model_id: assembly.model_path(cfg, model_id) for model_id in cfg.models}
    check_checkpoint_dir(checkpoint)
    trained = set(assembly.trained_models(cfg))
    dirs: dict[str, Path] = {}
    for model_id in cfg.models:
        saved = checkpoint / model_id
        if saved.is_dir():
            if not (saved / "config.json").is_file():
                raise FileNotFoundError(
                    f"checkpoint model directory {str(saved)!r} has no config.json (not a Hugging Face model directory)"
                )
            dirs[model_id] = saved
        elif model_id in trained:
            raise FileNotFoundError(
                f"checkpoint {str(checkpoint)!r} has no directory for trained model {model_id!r} "
                f"(expected {str(saved)!r}); is it a checkpoint of a run of this config?"
            )
        else:  # frozen, or trainable but trained by no agent: never saved, its config weights are the ones
            dirs[model_id] = assembly.model_path(cfg, model_id)
    return dirs
