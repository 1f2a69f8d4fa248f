"""Run checkpoints: `checkpoints/step_<N>/<model_id>/` is a plain Hugging Face directory per model
(transformers and vLLM load it as is); the trainer state (optimizer, running statistics, sampler position,
RNG states) lives beside it in `step_<N>/trainer_state/`. A `COMPLETE` marker is written last, so a run
killed mid-save resumes from the previous complete checkpoint instead of a torn one.

Last means durable, not just written: after a power loss or a kernel crash the page cache is gone, and a
marker that reached the disk before the files it vouches for would point at empty or truncated weights.
Every file and directory of the checkpoint is fsync'ed before the marker is written, and the marker with
its directory after.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return None
    done = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / "COMPLETE").exists():
            done.append((int(match.group(1)), child))
    return max(done)[1] if done else None


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    models: dict[str, tuple[torch.nn.Module, object]],
    trainer_states: dict[str, dict],
    run_state: dict,
) -> Path:
    """Write weights (HF dirs), per-model trainer state and the run state (JSON) for `step`."""
    from drmas.models import save_checkpoint_model

    target = checkpoint_dir(output_dir, step)
    if target.exists():
        shutil.rmtree(target)
    (target / "trainer_state").mkdir(parents=True)
    for model_id, (model, tokenizer) in models.items():
        save_checkpoint_model(model, tokenizer, target / model_id)
    for model_id, state in trainer_states.items():
        torch.save(state, target / "trainer_state" / f"{model_id}.pt")
    (target / "trainer_state" / "run_state.json").write_text(json.dumps(run_state, indent=1))
    torch.save(rng_state(), target / "trainer_state" / "rng.pt")
    sync_tree(target)
    marker = target / "COMPLETE"
    with open(marker, "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    _sync_dir(target)
    _sync_dir(target.parent)  # the step directory's own entry in checkpoints/
    return target


def sync_tree(root: Path) -> None:
    """fsync every file under `root`, then every directory (deepest first), so names and contents are on disk."""
    directories = []
    for dirpath, _, filenames in os.walk(root):
        directories.append(Path(dirpath))
        for name in filenames:
            with open(Path(dirpath) / name, "rb") as f:
                os.fsync(f.fileno())
    for directory in reversed(directories):
        _sync_dir(directory)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_model_weights(ckpt: Path, model_id: str, model: torch.nn.Module) -> None:
    """Copy the saved weights of `model_id` into `model` in place (its optimizer keeps pointing at them)."""
    from safetensors.torch import load_file

    tensors = {}
    for shard in sorted((ckpt / model_id).glob("*.safetensors")):
        tensors.update(load_file(shard))
    if not tensors:
        raise FileNotFoundError(f"{ckpt / model_id}: no *.safetensors weights")
    model.load_state_dict(tensors, strict=False)


def load_trainer_state(ckpt: Path, model_id: str) -> dict:
    return torch.load(ckpt / "trainer_state" / f"{model_id}.pt", weights_only=False)


def load_run_state(ckpt: Path) -> dict:
    state = json.loads((ckpt / "trainer_state" / "run_state.json").read_text())
    set_rng_state(torch.load(ckpt / "trainer_state" / "rng.pt", weights_only=False))
    return state


def seed_everything(seed: int) -> None:
    """Seed Python, numpy and torch at the start of a process (the state saved below continues from it)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
