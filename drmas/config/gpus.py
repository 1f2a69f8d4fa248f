"""`pipeline.gpus`: which of this machine's GPUs each process of the local launcher sees (applied by
`drmas.launch.gpus`), and the config-time checks of that plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from drmas.config.fields import help_field as _f


@dataclass
class GpuPlanConfig:
    learners: dict[str, list[int]] = _f(
        {}, "Learner process -> its GPUs, one per rank (models.<id>.ranks entries, in rank order), e.g. "
        "{policy: [0, 1]}. A learner process is a trained model's id, or for a model with adapters the model's key "
        "(one process trains them all) or, with learner_per_adapter, <model>/<adapter>. A learner left out sees "
        "every GPU (as without pipeline.gpus).")
    rollouts: list[int] = _f(
        [], "GPUs the rollout processes share out, per_rollout at a time (rollout i takes slice i, round robin). "
        "Empty: rollouts see every GPU. A GPU may be in a learner's list too (colocated; mind vLLM's "
        "gpu_memory_utilization).")
    per_rollout: int = _f(
        1, "GPUs each rollout process sees (all its engines together; vLLM's tensor_parallel_size must fit).")

    def active(self) -> bool:
        return bool(self.learners or self.rollouts)


def check_plan(plan: GpuPlanConfig, ranks: Mapping[str, int], devices: Mapping[str, str], launcher: str) -> list[str]:
    """What is wrong with `plan` for learner processes with these `ranks` and `models.<id>.device`s, each
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
            errors.append(f"{key}: {model!r} is not a learner process ({', '.join(ranks) or 'none'})")
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
