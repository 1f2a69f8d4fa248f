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
from typing import Sequence

from drmas.config.gpus import GpuPlanConfig


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
