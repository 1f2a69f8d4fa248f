"""Where a model's tensors live, and the numerics that go with it.

`models.<id>.device` places a model's learner (and its embedded engine): ``auto`` (CUDA when this process
sees a GPU, else CPU), ``cpu``, ``cuda`` or ``cuda:N``. It is resolved where the tensors are made, in the
process that holds them, because the machine that reads the config (a launcher) need not be the one that
trains. A learner on CUDA keeps its parameters and AdamW state in float32 (the master weights) and runs its
forward and backward passes under bfloat16 autocast, what RL trainers of this size do (verl, OpenRLHF);
log-probs, the loss and the gradient norm are computed in float32 either way. On CPU nothing is autocast.
"""

from __future__ import annotations

import contextlib
import os

import torch

from drmas.config.schema import DEVICE_SPEC


def check_device_spec(spec: str, key: str) -> None:
    """A device setting that can never be right, named by its key (config-time, no GPU needed)."""
    if not DEVICE_SPEC.match(spec):
        raise ValueError(f"{key}: {spec!r} is not a device (auto, cpu, cuda or cuda:N)")


def resolve_device(spec: str, key: str) -> torch.device:
    """The torch device `spec` means in this process; ValueError naming `key` when it asks for a GPU that
    is not there."""
    check_device_spec(spec, key)
    if spec == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{key}={spec}: this process sees no CUDA device (torch {torch.__version__}, "
                             f"CUDA_VISIBLE_DEVICES decides which GPUs a process sees); use cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{key}={spec}: only {torch.cuda.device_count()} CUDA device(s) visible")
    return device


def check_ranks(spec: str, ranks: int, key: str) -> None:
    """Refuse, naming `key`, `ranks` learner ranks of a model placed at `spec` that this machine cannot hold:
    each rank takes a GPU of its own (the first `ranks` visible ones) or, on CPU, at least one core. Under a
    multi-node torchrun (`--nnodes`), only this node's ranks (LOCAL_WORLD_SIZE) must fit here."""
    if ranks <= 1:
        return
    here = min(ranks, int(os.environ.get("LOCAL_WORLD_SIZE", ranks)))
    device = resolve_device(spec, key.rsplit(".", 1)[0] + ".device")
    if device.type == "cuda":
        have, what = torch.cuda.device_count(), "GPU(s) visible (CUDA_VISIBLE_DEVICES decides which)"
    else:
        have, what = len(os.sched_getaffinity(0)), "CPU core(s) available to this process"
    if here > have:
        unit = "a GPU" if device.type == "cuda" else "a CPU core"
        raise ValueError(f"{key}={ranks}: each learner rank needs {unit} of its own and this machine has {have} {what}")


def training_autocast(device: torch.device) -> contextlib.AbstractContextManager:
    """bfloat16 autocast for a learner's passes on CUDA (float32 master weights stay untouched); none on CPU."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
