"""Where a model's tensors live, and the numerics that go with it.

`models.<id>.device` places a model's learner (and its embedded engine): ``auto`` (CUDA when this process
sees a GPU, else CPU), ``cpu``, ``cuda`` or ``cuda:N``. It is resolved where the tensors are made, in the
process that holds them, because the machine that reads the config (a launcher) need not be the one that
trains.

The precision contract (`models.<id>.compute_dtype`): the engine generates in the precision the learner
computes its log-probs in. The learner keeps its parameters and AdamW state in `models.<id>.dtype` (the
master weights) and runs its forward passes in the compute dtype (autocast when the two differ); the engine
holds its weights in the compute dtype, and weight pushes send them in it. On both sides the log-probs,
the loss and the gradient norm are computed in float32 from those logits. With float32 on both sides (the
default) matmuls run in full float32 on CUDA as well (no TF32), and the two sides agree to ~1e-5 per token;
bfloat16 halves the engine's memory and the bytes of every push, but a bfloat16 engine and an autocast
learner round differently (one keeps a bfloat16 residual stream, the other float32): their log-probs
differ by ~1e-2 per token, which the decoupled PPO ratio then absorbs as off-policy noise.
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


def build_device(spec: str) -> torch.device:
    """Where to build (prime) a model placed at `spec` in this process: its GPU when this process has one
    (a launcher builds before its children start), else the CPU. Never refuses: placement errors are the
    learner's and the engine's to report."""
    if spec != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda" if spec == "auto" else spec)
        if device.index is None or device.index < torch.cuda.device_count():
            return device
    return torch.device("cpu")


def compute_autocast(device: torch.device, param_dtype: torch.dtype,
                     compute_dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """The learner's forward passes in `compute_dtype`: autocast to it over wider parameters (float32
    master weights); nothing when the parameters are in it already (as the engine's are)."""
    if compute_dtype == param_dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=compute_dtype)


def exact_float32(device: torch.device) -> None:
    """Full float32 matmuls on CUDA (no TF32), so that float32 on both sides of the contract means the same
    arithmetic. Process-wide; the default of torch, made explicit against an environment that changed it."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision("highest")
