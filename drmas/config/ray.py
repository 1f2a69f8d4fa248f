"""`pipeline.ray`: where the Ray launcher runs the pipeline and what each process asks of the cluster.

Plain dataclass with help text per field (hooked into `drmas.config.schema`); no Ray import, so the config
loads and validates without the optional extra installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f

HOSTS = ("auto", "loopback", "node")


@dataclass
class RayConfig(Section):
    address: Optional[str] = _f(
        None, "Ray cluster of pipeline.launcher=ray: null = start a local Ray for this run (stopped at its end), "
        "'auto' = join the cluster `ray start` runs on this machine, or the head's address host:port.")
    num_cpus: int = _f(
        0, "Logical CPUs of the local Ray started when address is null. Each process (buffer, learner rank, "
        "rollout) reserves cpus_per_process of them; 0 = this machine's cores, raised to what the run's processes "
        "reserve so every one can be placed. A number below that is refused before anything starts.")
    object_store_mb: int = _f(
        128, "Object store of the local Ray started when address is null, in MiB (drmas moves no data through "
        "it: samples go over ZeroMQ, weights over torch.distributed).")
    cpus_per_process: float = _f(1.0, "Logical CPUs Ray reserves for the buffer, each rollout and each learner rank.")
    learner_gpus_per_rank: float = _f(
        0.0, "GPUs each learner rank gets; a model's ranks are reserved together on one node (one placement "
        "group per model). 0 = CPU learners.")
    rollout_gpus: float = _f(
        0.0, "GPUs each rollout process gets (all its engines together, e.g. vLLM tensor_parallel_size); "
        "0 = CPU engines.")
    host: str = _f(
        "auto", "Address the buffer and the learners bind and announce: 'auto' (127.0.0.1 while the cluster "
        "has one node, else the node's IP), 'loopback' or 'node' (always the node's IP). Any non-loopback "
        "endpoint makes the launcher generate CURVE keys for the run and hand them to every process.")
    placement_timeout_s: float = _f(
        300.0, "Longest wait for the cluster to place a process (its CPUs/GPUs); then the run stops with a "
        "message naming what could not be placed.")
    control_name: str = _f(
        "drmas", "Name of the run's control actor (namespace 'drmas'): `drmas rollouts add|remove N --name NAME` "
        "reaches the run through it. Two runs on one cluster need different names.")

    def problems(self, where: str) -> list[str]:
        found = []
        if self.host not in HOSTS:
            found.append(f"{where}.host: {self.host!r} is not one of {', '.join(HOSTS)}")
        for key in ("num_cpus", "cpus_per_process", "learner_gpus_per_rank", "rollout_gpus"):
            if getattr(self, key) < 0:
                found.append(f"{where}.{key}: must be >= 0, got {getattr(self, key)}")
        if self.object_store_mb < 75:
            found.append(f"{where}.object_store_mb: Ray needs at least 75, got {self.object_store_mb}")
        if self.placement_timeout_s <= 0:
            found.append(f"{where}.placement_timeout_s: must be > 0, got {self.placement_timeout_s}")
        if self.address is not None and not self.address.strip():
            found.append(f"{where}.address: empty; use null (local Ray), 'auto' or host:port")
        if not self.control_name:
            found.append(f"{where}.control_name: must not be empty")
        return found
