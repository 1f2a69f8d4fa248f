"""The Ray launcher (`pipeline.launcher=ray`): the pipeline's processes as Ray actors placed on a cluster.

Design, and why:

* **Ray places, drmas runs.** Each process (buffer, each learner, each rollout) is hosted by a
  `ProcessHost` actor that starts the very entry point the local launcher starts (see
  `drmas.launch.ray_host`). Ray decides the node and reserves the CPUs/GPUs (`pipeline.ray`); the process
  keeps its own signals, exit codes, logs and torchrun. The run around the processes (output directory,
  held-out evaluation, bounded restarts, stop order, summary) is `drmas.launch.supervisor`, shared with the
  local launcher, so both produce the same outputs and say the same things.
* **Servers sit in placement groups.** The buffer and each learner (all of its ranks, `ranks x
  learner_gpus_per_rank` GPUs in one STRICT_PACK bundle: torchrun starts the ranks on that node, as
  locally) get a placement group of their own. The group keeps its node for the whole run, so a restarted
  buffer or learner comes back on the same node and binds the same address: nobody else has to learn a new
  endpoint. Rollouts only connect, so they go wherever Ray has room (`rollout_gpus` each).
* **Endpoints are found where the processes run.** Server hosts are placed first and report their node
  address and ports free on that node; the config every process loads is written only then (buffer, then
  learners, then rollouts start from it). When an endpoint is not loopback, CURVE keys are generated for
  the run and travel to every host with the config (`drmas.launch.placement`).
* **One restart policy.** Ray's own actor restarts are off (`max_restarts=0`): a process that exits and
  an actor that is lost (killed, its node gone) both go through the same `RestartBook` as local processes
  (bounded, with backoff, learners resume from their last checkpoint; a lost actor is replaced in its
  placement group), and a run that cannot recover stops with the reason instead of hanging.
* **Elastic rollouts** through a named control actor (`drmas.launch.elastic`): `drmas rollouts add|remove N`.
* **Output**: the driver collects every host's output lines on each supervision round and prints them behind
  `[name]`; each process also writes `process.log`, metrics and TensorBoard under
  `<trainer.output_dir>/<name>/`. Across nodes that directory must be on a filesystem every node shares (the
  driver reads the learners' checkpoints for the held-out evaluation).
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, TextIO

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from drmas import assembly
from drmas.config.derived import model_config
from drmas.config.load import to_yaml
from drmas.config.schema import DrmasConfig
from drmas.launch.elastic import NAMESPACE, RolloutControl, use_ray_token_if_present
from drmas.launch.placement import add_run_keys, key_files, local_ray_cpus, place_endpoints, plugin_files
from drmas.launch.ray_host import ProcessHost
from drmas.launch.supervisor import LOST, Child, PlacementError, Supervisor

_Host = ray.remote(ProcessHost)
_Control = ray.remote(RolloutControl)
_CALL_TIMEOUT_S = 60.0


@dataclass
class RayChild(Child):
    launcher: Optional["RayLauncher"] = None
    host: Any = None  # the ProcessHost actor handle (None: not yet created, or lost)
    pg: Any = None  # its placement group (buffer and learners)
    lost: bool = False
    placing: Any = None  # (new host, its `where` call, deadline) while a replacement host is being placed

    def placed(self) -> bool:
        """A lost host is replaced without blocking: the new actor is asked for once, then checked each round
        until Ray has placed and started it (PlacementError after the launcher's placement timeout)."""
        if self.host is not None and not self.lost:
            return True
        launcher = self.launcher
        if self.placing is None:
            self.placing = launcher.request_host(self.name, self.pg)
        host, ready, deadline = self.placing
        if ray.wait([ready], timeout=0)[0]:
            self.placing = None
            try:
                ray.get(ready)
            except RayActorError as exc:
                raise PlacementError(f"{self.name}: its new Ray actor died while starting ({exc})") from None
            self.host, self.lost = host, False
            return True
        if time.monotonic() > deadline:
            self.placing = None
            ray.kill(host)
            raise PlacementError(launcher.unplaced(self.name, self.pg))
        return False

    def spawn(self) -> str:
        launcher = self.launcher
        if self.host is None or self.lost:
            self.host = launcher.new_host(self.name, self.pg)
            self.lost = False
        ranks = model_config(launcher.cfg, self.args[1]).ranks if self.role == "learner" else 1
        try:
            ip, actor_pid = launcher.call(self.host.where.remote())
            pid = launcher.call(self.host.start.remote(self.module, self.args, ranks, launcher.config_text,
                                                       launcher.key_root, launcher.key_files, os.getcwd(),
                                                       launcher.plugins))
        except RayActorError as exc:
            self.lost = True
            raise PlacementError(f"{self.name}: its Ray actor died while starting it ({exc})") from None
        self.pids.append(pid)
        return f" on {ip}, actor pid {actor_pid}"

    def poll(self) -> Optional[int]:
        if self.lost:
            return LOST
        try:
            lines, rc = self.launcher.call(self.host.poll.remote())
        except RayActorError:
            self.lost = True
            return LOST
        for line in lines:
            self.launcher._say(self.name, line)
        return rc

    def _signal(self, sig: int) -> None:
        if not self.lost:
            try:
                self.launcher.call(self.host.signal.remote(sig))
            except RayActorError:
                self.lost = True

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def close(self) -> None:
        """Free the node's resources the host holds (a removed rollout's CPUs/GPUs go back to Ray at once)."""
        if self.placing is not None:  # a replacement still being placed
            ray.kill(self.placing[0])
            self.placing = None
        if self.host is not None:
            ray.kill(self.host)
            self.lost = True


class RayLauncher(Supervisor):
    poll_interval_s = 0.5  # each round asks every host for its output: one remote call each

    def __init__(self, cfg: DrmasConfig, out: TextIO = sys.stdout) -> None:
        cfg = copy.deepcopy(cfg)
        cfg.trainer.output_dir = str(Path(cfg.trainer.output_dir).resolve())  # the hosts' cwd may differ
        super().__init__(cfg, out)
        self.ray_cfg = cfg.pipeline.ray
        self.control = None
        self.placement_groups: list = []
        self.server_hosts: dict[str, tuple[Any, Any]] = {}  # name -> (host actor, placement group)
        self.config_text = ""
        self.key_root: Optional[str] = None
        self.key_files: dict[str, str] = {}
        self.plugins = plugin_files(cfg)  # their source travels to every host, as the keys do

    # ---- cluster -------------------------------------------------------------------------------------
    def _check_machine(self) -> None:
        """Join (or start) the Ray cluster and register the run's control actor; ValueError when neither works."""
        rc = self.ray_cfg
        kwargs: dict[str, Any] = dict(namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        if rc.address is None:  # a Ray of its own, sized to place every process (or refused at once)
            kwargs.update(num_cpus=local_ray_cpus(self.cfg, os.cpu_count() or 1), include_dashboard=False,
                          object_store_memory=rc.object_store_mb * 1024 * 1024)
        if use_ray_token_if_present(rc.address):
            ray._raylet.Config.initialize("")  # Ray read the mode at import; this is how it re-reads it itself
        try:
            ray.init(address=rc.address, **kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(f"pipeline.ray.address={rc.address}: cannot join the Ray cluster: {exc}") from None
        try:
            self.control = _Control.options(name=rc.control_name, namespace=NAMESPACE, num_cpus=0).remote()
            self.call(self.control.take.remote([]))
        except ValueError:
            raise ValueError(f"pipeline.ray.control_name={rc.control_name!r}: another drmas run on this cluster "
                             "uses that name; give this one another") from None
        self._say("launcher", f"Ray cluster at {ray.get_runtime_context().gcs_address} "
                              f"({len(self._alive_nodes())} node(s), {ray.cluster_resources().get('CPU', 0):g} CPUs); "
                              f"control actor {rc.control_name!r}")

    def _alive_nodes(self) -> list[dict]:
        return [n for n in ray.nodes() if n.get("Alive")]

    def call(self, ref, timeout: float = _CALL_TIMEOUT_S):
        return ray.get(ref, timeout=timeout)

    def _host_options(self, pg) -> dict[str, Any]:
        rc = self.ray_cfg
        options: dict[str, Any] = dict(max_restarts=0, max_concurrency=1)
        if pg is not None:  # the whole bundle: a learner's GPUs all show in its CUDA_VISIBLE_DEVICES (torchrun ranks)
            bundle = pg.bundle_specs[0]
            options.update(num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                           scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0))
        else:
            options.update(num_cpus=rc.cpus_per_process, num_gpus=rc.rollout_gpus)
        return options

    def _placement_wait_s(self, pg) -> float:
        # In a ready placement group the resources are already held: what remains is starting the actor's worker
        # process, which a loaded node may take longer than a short placement timeout for; that is not placement.
        rc = self.ray_cfg
        return rc.placement_timeout_s if pg is None else max(rc.placement_timeout_s, _CALL_TIMEOUT_S)

    def unplaced(self, name: str, pg) -> str:
        """Why `name` has no host: what it asked for and how long the cluster was given."""
        options = self._host_options(pg)
        return (f"{name}: the Ray cluster could not place and start it within {self._placement_wait_s(pg):g} s "
                f"(pipeline.ray.placement_timeout_s={self.ray_cfg.placement_timeout_s:g}; it asks for "
                f"{options.get('num_cpus')} CPUs and {options.get('num_gpus', 0)} GPUs; see `ray status`)")

    def request_host(self, name: str, pg) -> tuple[Any, Any, float]:
        """Ask Ray for a ProcessHost for `name` without waiting: (host, its `where` call, placement deadline)."""
        host = _Host.options(**self._host_options(pg)).remote(name)
        return host, host.where.remote(), time.monotonic() + self._placement_wait_s(pg)

    def new_host(self, name: str, pg) -> Any:
        """A ProcessHost for `name`, in its placement group (servers) or anywhere it fits (rollouts), once Ray
        has placed it; PlacementError naming the process and its resources when the cluster cannot."""
        host, ready, deadline = self.request_host(name, pg)
        try:
            self.call(ready, timeout=max(deadline - time.monotonic(), 0.0))
        except GetTimeoutError:
            ray.kill(host)
            raise PlacementError(self.unplaced(name, pg)) from None
        return host

    def _server_group(self, name: str, cpus: float, gpus: float):
        bundle = {"CPU": cpus} | ({"GPU": gpus} if gpus else {})
        pg = placement_group([bundle], strategy="STRICT_PACK")
        self.placement_groups.append(pg)
        try:
            self.call(pg.ready(), timeout=self.ray_cfg.placement_timeout_s)
        except GetTimeoutError:
            raise PlacementError(f"{name}: no node of the Ray cluster has {bundle} free (placement group not ready "
                               f"within pipeline.ray.placement_timeout_s={self.ray_cfg.placement_timeout_s:g} s; "
                               "see `ray status`)") from None
        return pg

    # ---- placement -----------------------------------------------------------------------------------
    def _place(self) -> None:
        rc = self.ray_cfg
        try:
            names = {"buffer": (rc.cpus_per_process, 0.0)}
            for process in assembly.learner_processes(self.cfg):
                ranks = model_config(self.cfg, process).ranks
                names[f"learner-{process}"] = (rc.cpus_per_process * ranks, rc.learner_gpus_per_rank * ranks)
            for name, (cpus, gpus) in names.items():
                pg = self._server_group(name, cpus, gpus)
                self.server_hosts[name] = (self.new_host(name, pg), pg)
        except PlacementError as exc:
            raise ValueError(str(exc)) from None
        ips = {name: self.call(host.where.remote())[0] for name, (host, _) in self.server_hosts.items()}
        hosts = {name: host for name, (host, _) in self.server_hosts.items()}

        def free_ports(name: str, count: int) -> list[int]:
            return self.call(hosts[name].free_ports.remote("0.0.0.0", count))

        models = assembly.trained_models(self.cfg)
        learner_ips = {m: ips[f"learner-{assembly.learner_process_of(self.cfg, m)}"] for m in models}
        self.cfg = place_endpoints(self.cfg, ips["buffer"], learner_ips, free_ports,
                                   multi_node=len(self._alive_nodes()) > 1)
        key_root = add_run_keys(self.cfg, models, Path(self.cfg.trainer.output_dir) / "keys")
        if key_root is not None:
            self._say("launcher", f"endpoints are not loopback: CURVE keys for this run under {key_root}")
            self.key_root, self.key_files = str(key_root), key_files(key_root)
        self.config_text = to_yaml(self.cfg)

    def _child(self, name: str, role: str, module: str, args: list[str]) -> Child:
        host, pg = self.server_hosts.get(name, (None, None))
        return RayChild(name, role, module, args, launcher=self, host=host, pg=pg)

    # ---- elastic rollouts ----------------------------------------------------------------------------
    def _tick(self) -> None:
        rollouts = [c for c in self.children if c.role == "rollout" and not c.retired]
        try:
            changes = self.call(self.control.take.remote([c.name for c in rollouts]))
        except (RayActorError, GetTimeoutError):
            return  # the mailbox is gone: the run goes on without elastic changes
        for delta in changes:
            if delta > 0:
                start = 1 + max((int(c.name.split("-")[1]) for c in self.children if c.role == "rollout"), default=-1)
                self._say("launcher", f"adding {delta} rollout(s) on request")
                for index in range(start, start + delta):
                    try:
                        self.add_rollout(index)
                    except PlacementError as exc:  # the cluster has no room: the run goes on as it was
                        self._say("launcher", f"{exc}: not added")
                        break
            else:
                keep = max(len(rollouts) + delta, 1)
                if keep > len(rollouts) + delta:
                    self._say("launcher", f"asked to remove {-delta} of {len(rollouts)} rollouts: keeping 1")
                for child in rollouts[keep:][::-1]:
                    self._say("launcher", f"removing {child.name} on request")
                    self.retire(child)
                rollouts = rollouts[:keep]

    def _shutdown(self) -> None:
        if not ray.is_initialized():
            return
        for host, _ in self.server_hosts.values():  # children closed theirs; these may never have become one
            ray.kill(host)
        if self.control is not None:
            ray.kill(self.control)
        for pg in self.placement_groups:
            remove_placement_group(pg)
        ray.shutdown()
