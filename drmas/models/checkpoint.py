"""Run checkpoints: `checkpoints/step_<N>/<model_id>/` is a plain Hugging Face directory per model
(transformers and vLLM load it as is); the trainer state lives beside it in `step_<N>/trainer_state/`:
per model a `torch.distributed.checkpoint` (DCP) directory `<model_id>/` with the exact weights and the
AdamW state, plus the run state (JSON: version or step, running statistics, lineage, sampler position)
and the RNG states. A `COMPLETE` marker is written last, so a run killed mid-save resumes from the
previous complete checkpoint instead of a torn one.

Why DCP, also for a one-process learner: a learner of N FSDP2 ranks holds 1/N of every weight and AdamW
moment; DCP has each rank write its own shards, records every tensor by parameter name with its global
shape, and reads into whatever layout the loading process has, so a checkpoint written by N ranks resumes
on M (2 -> 2, 2 -> 1, 1 -> 2). One layout for every rank count means resume never asks how many ranks
wrote a checkpoint. With N ranks every rank calls `save_checkpoint` (the trainer state is a collective);
rank 0 alone writes the HF directory, the run state and the marker, after every rank's shards are written.

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
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

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


def torn_checkpoints(output_dir: str | Path) -> list[Path]:
    """Step directories newer than the newest complete checkpoint that have no `COMPLETE` marker: saves cut
    short (a kill, a crash, a full disk). Resume skips them; its caller says so, since the user may have
    expected to continue from there."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    latest = latest_checkpoint(output_dir)
    newest = -1 if latest is None else int(_STEP_DIR.match(latest.name).group(1))
    torn = [(int(m.group(1)), child) for child in root.iterdir()
            if (m := _STEP_DIR.match(child.name)) and not (child / "COMPLETE").exists()]
    return [path for step, path in sorted(torn) if step > newest]


def resume_line(output_dir: str | Path, unit: str = "step") -> str:
    """What resuming from `output_dir` finds, for the log: the checkpoint it continues from, the torn ones it
    skips, or that there is none (then it starts at step 0, which a user asking to resume must be told)."""
    ckpt = latest_checkpoint(output_dir)
    torn = torn_checkpoints(output_dir)
    skipped = "; skipping " + ", ".join(f"{p.name} (no COMPLETE marker: its save was cut short)" for p in torn) \
        if torn else ""
    if ckpt is None:
        return f"trainer.resume=true: no complete checkpoint in {output_dir}{skipped}: starting at {unit} 0"
    return f"resuming from {ckpt}{skipped}"


def save_checkpoint(
    output_dir: str | Path,
    step: int,
    models: dict[str, tuple[torch.nn.Module, object]],
    trainer_states: dict[str, dict],
    run_state: dict,
    keep: int = 0,
) -> Path:
    """Write weights (HF dirs), per-model trainer state (DCP) and the run state (JSON) for `step`.

    `trainer_states` are DCP state dicts (a trainer's `state_dict()`). Inside a process group every rank
    calls this with the same `output_dir`, `step` and trainer-state keys; `models`, `run_state` and `keep`
    are only read on rank 0, which alone returns once the checkpoint is complete -- and, with `keep`, once
    the checkpoints older than the newest `keep` are deleted (`prune_checkpoints`)."""
    from drmas.models.loading import save_checkpoint_model

    target = checkpoint_dir(output_dir, step)
    lead = not dist.is_initialized() or dist.get_rank() == 0
    if lead:
        if target.exists():
            shutil.rmtree(target)
        (target / "trainer_state").mkdir(parents=True)
    if dist.is_initialized():
        dist.barrier()  # no rank writes into the directory before rank 0 has cleared it
    for model_id, state in trainer_states.items():
        # each rank fsyncs the shards it wrote; rank 0's return means every rank's are written
        with _one_process_is_fine():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(target / "trainer_state" / model_id,
                                                                sync_files=True), no_dist=not dist.is_initialized())
    if not lead:
        return target
    for model_id, (model, tokenizer) in models.items():
        save_checkpoint_model(model, tokenizer, target / model_id)
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
    if keep:
        prune_checkpoints(output_dir, keep)
    return target


def prune_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete every checkpoint but the newest `keep` complete ones; returns what was deleted.

    Also deleted: torn saves (no `COMPLETE`) older than the newest complete checkpoint, which nothing can
    resume from. A torn save newer than it is left alone: it is the directory the next save of that step
    replaces. Only called after a save's marker is durable, so the newest checkpoint is never at risk."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    root = Path(output_dir) / "checkpoints"
    steps = sorted((int(m.group(1)), child) for child in (root.iterdir() if root.is_dir() else ())
                   if (m := _STEP_DIR.match(child.name)))
    complete = [(step, path) for step, path in steps if (path / "COMPLETE").exists()]
    if not complete:
        return []
    newest = complete[-1][0]
    doomed = complete[:-keep] + [(s, p) for s, p in steps if s < newest and not (p / "COMPLETE").exists()]
    for _, path in doomed:
        # the marker first: a deletion cut short leaves a torn directory that is never resumed from
        (path / "COMPLETE").unlink(missing_ok=True)
        shutil.rmtree(path)
    return [path for _, path in doomed]


@contextmanager
def _one_process_is_fine():
    """DCP warns on every save and load outside a process group; for a one-process learner that is the intent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


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


def load_trainer(ckpt: Path, model_id: str, trainer) -> None:
    """Load `model_id`'s weights and optimizer state from `ckpt` into `trainer` (a `PolicyTrainer`), in
    the layout this process holds them (whole, or this rank's shards: a collective inside a process group),
    whatever number of ranks wrote them."""
    path = ckpt / "trainer_state" / model_id
    if not (path / ".metadata").is_file():
        raise FileNotFoundError(f"{path}: no distributed trainer state (.metadata); checkpoints written before "
                                "trainer state moved to torch.distributed.checkpoint cannot be resumed")
    state = trainer.state_dict()
    with _one_process_is_fine():
        dcp.load(state, storage_reader=dcp.FileSystemReader(path), no_dist=not dist.is_initialized())
    trainer.load_state_dict(state)


def peek_run_state(output_dir: str | Path) -> dict | None:
    """The run state of the newest complete checkpoint (None: none), read without restoring anything: what a
    process checks before it builds its models (e.g. the drawing order, `drmas.tasks.sampler.order_change`)."""
    ckpt = latest_checkpoint(output_dir)
    return None if ckpt is None else json.loads((ckpt / "trainer_state" / "run_state.json").read_text())


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
