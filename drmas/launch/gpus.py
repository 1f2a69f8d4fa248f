"""`pipeline.gpus`: which of this machine's GPUs each process of the local launcher sees.

Without it every child of `drmas run` sees every GPU the launcher sees, so on a multi-GPU machine each
learner rank takes GPU i of all of them and every rollout's vLLM engine lands on GPU 0 beside the learner.
With it the launcher gives each process its own `CUDA_VISIBLE_DEVICES`: a learner gets exactly one GPU per
rank (its ranks take them in order: rank i sees its model on `cuda:i` of its list), and the rollouts share
out the rollout GPUs `per_rollout` at a time (a vLLM engine with tensor_parallel_size N needs N), round
robin when there are more rollouts than slices. CUDA_VISIBLE_DEVICES is how both torch and vLLM are told,
and a restarted process gets the same GPUs again. The Ray launcher places GPUs itself (`pipeline.ray`).

GPU numbers count the GPUs the launcher itself sees: under `CUDA_VISIBLE_DEVICES=4,5,6,7 drmas run`,
`rollouts: [0, 1]` are the machine's GPUs 4 and 5.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from drmas.fields import help_field as _f


@dataclass
class GpuPlanConfig:
    learners: dict[str, list[int]] = _f(
        {}, "Model id -> the GPUs of that model's learner, one per rank (models.<id>.ranks entries, in rank "
        "order), e.g. {policy: [0, 1]}. A trained model left out sees every GPU (as without pipeline.gpus).")
    rollouts: list[int] = _f(
        [], "GPUs the rollout processes share out, per_rollout at a time (rollout i takes slice i, round robin). "
        "Empty: rollouts see every GPU. A GPU may be in a learner's list too (colocated; mind vLLM's "
        "gpu_memory_utilization).")
    per_rollout: int = _f(
        1, "GPUs each rollout process sees (all its engines together; vLLM's tensor_parallel_size must fit).")

    def active(self) -> bool:
        return bool(self.learners or self.rollouts)


def check_plan(plan: GpuPlanConfig, ranks: Mapping[str, int], devices: Mapping[str, str], launcher: str) -> list[str]:
    """What is wrong with `plan` for trained models with these `ranks` and `models.<id>.device`s, each
    message naming its key (config-time checks; whether the GPUs exist is checked by `GpuAssignment`)."""
    errors: list[str] = []
    if plan.per_rollout < 1:
        errors.append(f"pipeline.gpus.per_rollout: must be >= 1, got {plan.per_rollout}")
    if not plan.active():
        return errors
    if launcher != "local":
        errors.append("pipeline.gpus: the local launcher's GPU plan; with pipeline.launcher=ray set "
                      "pipeline.ray.learner_gpus_per_rank and pipeline.ray.rollout_gpus instead")
    for model, gpus in plan.learners.items():
        key = f"pipeline.gpus.learners.{model}"
        if model not in ranks:
            errors.append(f"{key}: {model!r} is not a trained model ({', '.join(ranks) or 'none'})")
            continue
        if len(gpus) != ranks[model]:
            errors.append(f"{key}: {len(gpus)} GPU(s) for models.{model}.ranks={ranks[model]}: give one per rank")
        if len(set(gpus)) != len(gpus):
            errors.append(f"{key}: {gpus} repeats a GPU; two ranks cannot share one (NCCL refuses it)")
        if devices.get(model) == "cpu":
            errors.append(f"{key}: models.{model}.device=cpu; a CPU learner takes no GPU")
    if plan.rollouts and plan.per_rollout >= 1:
        if len(set(plan.rollouts)) != len(plan.rollouts):
            errors.append(f"pipeline.gpus.rollouts: {plan.rollouts} repeats a GPU")
        if len(plan.rollouts) % plan.per_rollout:
            errors.append(f"pipeline.gpus.rollouts: {len(plan.rollouts)} GPU(s) do not split into slices of "
                          f"pipeline.gpus.per_rollout={plan.per_rollout}")
    for key, gpus in [*((f"learners.{m}", g) for m, g in plan.learners.items()), ("rollouts", plan.rollouts)]:
        if any(g < 0 for g in gpus):
            errors.append(f"pipeline.gpus.{key}: GPU numbers are >= 0, got {gpus}")
    return errors


def visible_gpus() -> list[str]:
    """The launcher's GPUs as CUDA_VISIBLE_DEVICES entries (indices or UUIDs), in order."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


class GpuAssignment:
    """Each process's CUDA_VISIBLE_DEVICES under a checked `plan`, given the launcher's `visible` GPUs.
    Built before anything starts: a GPU number the launcher does not see is a ValueError naming the key."""

    def __init__(self, plan: GpuPlanConfig, visible: Sequence[str]) -> None:
        self.visible = list(visible)
        self.learners = {model: self._entries(f"learners.{model}", gpus) for model, gpus in plan.learners.items()}
        pool = self._entries("rollouts", plan.rollouts)
        self.slices = [pool[i:i + plan.per_rollout] for i in range(0, len(pool), plan.per_rollout)]

    def _entries(self, key: str, gpus: Sequence[int]) -> list[str]:
        missing = [g for g in gpus if g >= len(self.visible)]
        if missing:
            seen = f" ({','.join(self.visible)})" if self.visible else ""
            raise ValueError(f"pipeline.gpus.{key}: GPU {missing[0]} is not there: the launcher sees "
                             f"{len(self.visible)} GPU(s){seen}")
        return [self.visible[g] for g in gpus]

    def for_learner(self, model: str) -> str | None:
        """CUDA_VISIBLE_DEVICES of `model`'s learner (all its ranks), or None: it sees the launcher's GPUs."""
        gpus = self.learners.get(model)
        return ",".join(gpus) if gpus is not None else None

    def for_rollout(self, index: int) -> str | None:
        """CUDA_VISIBLE_DEVICES of rollout `index` (slice index mod the number of slices), or None."""
        return ",".join(self.slices[index % len(self.slices)]) if self.slices else None
