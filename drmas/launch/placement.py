"""Endpoints, CURVE keys and the CPUs of a run whose processes are placed by a cluster (the Ray launcher),
without Ray.

Where a process lands is known only once the cluster has placed it, so its endpoints are fixed afterwards:
the buffer and every learner report their node's address and free ports chosen *on that node* (a port free
on the driver's machine says nothing about another node), and `place_endpoints` writes them into the config
every process then loads (buffer first, then learners; rollouts only connect). When any endpoint is not
loopback the run's sockets are reachable from the network, where the buffer and the learners refuse to
listen without CURVE (`drmas.runtime.netsec`), so `add_run_keys` generates one key set for the run (unless the
config names keys already) and every process gets it: a cluster node need not share a filesystem with the
driver, so key files travel as text (`key_files`) and each host writes them next to its copy of the config
(`localize`). So do the run's plugin files (`plugin_files`): a host that does not have one at the driver's
path (no shared filesystem) imports the copy it was sent; a plugin module (a name, not a file) must be
installed on every node. A local Ray the run starts for itself gets enough logical CPUs to place every
process (`local_ray_cpus`).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Callable, Mapping, Optional
from urllib.parse import urlsplit

import yaml

from drmas.config.derived import learner_process_of, learner_processes, model_config
from drmas.config.load import is_plugin_path
from drmas.config.schema import DrmasConfig
from drmas.runtime.endpoints import BUFFER_ENDPOINTS, learner_address
from drmas.runtime.keys import KEY_FIELDS, generate_keys
from drmas.runtime.netsec import is_local_endpoint, is_loopback_host

LOOPBACK = "127.0.0.1"


def bind_host(mode: str, configured: str, node_ip: str, multi_node: bool) -> str:
    """The address a server process on `node_ip` binds and announces (`pipeline.ray.host`). A configured
    non-loopback host is the user's choice and kept; a loopback one becomes the node's address when other
    nodes must reach it ('node', or 'auto' on a cluster of more than one node)."""
    if not is_loopback_host(configured):
        return configured
    if mode == "node" or (mode == "auto" and multi_node):
        return node_ip
    return LOOPBACK if configured == "localhost" else configured


def place_endpoints(cfg: DrmasConfig, buffer_ip: str, learner_ips: Mapping[str, str],
                    free_ports: Callable[[str, int], list[int]], multi_node: bool) -> DrmasConfig:
    """A copy of `cfg` whose buffer and learner endpoints are where they were placed: the node's address
    (see `bind_host`) and, for every port 0, a port `free_ports(name, n)` found free on that process's node
    (`name` is "buffer" or "learner-<process>", the learner process of the model, see `learner_processes`).
    `learner_ips`: the node's address of each trained model id's learner. Fixed ports are kept."""
    cfg = copy.deepcopy(cfg)
    mode = cfg.pipeline.ray.host
    buf = cfg.pipeline.buffer
    parts = {key: urlsplit(getattr(buf, key)) for key in BUFFER_ENDPOINTS}
    wanted = [key for key, p in parts.items() if p.scheme == "tcp" and p.port in (None, 0)]
    ports = dict(zip(wanted, free_ports("buffer", len(wanted)))) if wanted else {}
    for key, p in parts.items():
        if p.scheme != "tcp":
            continue  # ipc/inproc: one machine by construction
        host = bind_host(mode, p.hostname or LOOPBACK, buffer_ip, multi_node)
        setattr(buf, key, f"tcp://{host}:{ports.get(key, p.port)}")
    for model, ip in learner_ips.items():
        host, port = learner_address(cfg, model)
        if port == 0:
            (port,) = free_ports(f"learner-{learner_process_of(cfg, model)}", 1)
        cfg.pipeline.learner_hosts[model] = bind_host(mode, host, ip, multi_node)
        cfg.pipeline.learner_ports[model] = port
    return cfg


def processes_placed(cfg: DrmasConfig) -> int:
    """Processes the run asks the cluster to place at the start: the buffer, every learner rank, every rollout."""
    return 1 + sum(model_config(cfg, p).ranks for p in learner_processes(cfg)) + cfg.pipeline.num_rollouts


def local_ray_cpus(cfg: DrmasConfig, cores: int) -> int:
    """Logical CPUs of the local Ray a run starts for itself (`pipeline.ray.address` null), enough to place
    every process: `pipeline.ray.num_cpus`, or with 0 this machine's `cores` but at least what the processes
    reserve (Ray's CPUs are a reservation count, not cores: five processes that each reserve one do run on two
    cores; a local Ray of two would leave three of them waiting for room that never comes). ValueError naming
    the key when a configured number cannot place the run."""
    ray = cfg.pipeline.ray
    asked = ray.cpus_per_process * processes_placed(cfg)
    if ray.num_cpus == 0:
        return max(cores, math.ceil(asked))
    if ray.num_cpus < asked:
        raise ValueError(
            f"pipeline.ray.num_cpus={ray.num_cpus}: the run reserves {asked:g} CPUs on the local Ray "
            f"(pipeline.ray.cpus_per_process={ray.cpus_per_process:g} x {processes_placed(cfg)} processes: the "
            f"buffer, the learner ranks and pipeline.num_rollouts={cfg.pipeline.num_rollouts} rollouts); set it to "
            f"at least {math.ceil(asked)}, or 0 to size it for the run")
    return ray.num_cpus


def exposed_endpoints(cfg: DrmasConfig, models) -> list[str]:
    """The endpoints of `cfg` other machines can reach (each one needs CURVE)."""
    endpoints = [getattr(cfg.pipeline.buffer, key) for key in BUFFER_ENDPOINTS]
    endpoints += ["tcp://%s:%d" % learner_address(cfg, model) for model in models]
    return [e for e in endpoints if not is_local_endpoint(e)]


def add_run_keys(cfg: DrmasConfig, models, key_root: Path) -> Optional[Path]:
    """When an endpoint is exposed and the config names no CURVE keys, write one key set under `key_root`
    and point every `pipeline.buffer.curve_*` field of `cfg` (in place) at it; returns `key_root`, or None
    when no keys were made. Keys the config names are left alone (the user distributed them)."""
    buf = cfg.pipeline.buffer
    if not exposed_endpoints(cfg, models) or any(getattr(buf, key) for key in KEY_FIELDS):
        return None
    layout = generate_keys(key_root, clients=1, force=True)
    for override in layout.server_overrides() + layout.client_overrides(0):
        key, value = override.split("=", 1)
        setattr(buf, key.rsplit(".", 1)[1], value)
    return key_root


def key_files(key_root: Optional[Path]) -> dict[str, str]:
    """Relative path -> text of every certificate under `key_root` (empty without keys)."""
    if key_root is None:
        return {}
    return {str(p.relative_to(key_root)): p.read_text() for p in sorted(key_root.rglob("*")) if p.is_file()}


def plugin_files(cfg: DrmasConfig) -> dict[str, str]:
    """Absolute path -> source of every plugin file the config imports (`plugins` entries that are files)."""
    return {target: Path(target).read_text() for target in cfg.plugins if is_plugin_path(target)}


def localize(config_text: str, key_root: Optional[str], files: Mapping[str, str], dest: Path,
             plugins: Mapping[str, str] = {}) -> Path:
    """Write the key `files` under `dest/keys` (secrets readable by their owner only) and the config, with
    the driver's `key_root` replaced by that directory, to `dest/config.yaml`; returns the config's path.
    Each of the `plugins` files (driver path -> source) missing here, or different here, is written under
    `dest/plugins/` and the config imports that copy."""
    dest.mkdir(parents=True, exist_ok=True)
    if key_root is not None and files:
        local = dest / "keys"
        for relative, text in files.items():
            path = local / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if path.name.endswith("_secret"):
                path.chmod(0o600)
        config_text = config_text.replace(key_root, str(local))
    config_text = _local_plugins(config_text, plugins, dest / "plugins")
    config = dest / "config.yaml"
    config.write_text(config_text)
    return config


def _local_plugins(config_text: str, plugins: Mapping[str, str], local: Path) -> str:
    moved = {}
    for path, source in plugins.items():
        here = Path(path)
        if here.is_file() and here.read_text() == source:
            continue  # a shared filesystem: the driver's file itself
        local.mkdir(parents=True, exist_ok=True)
        copy = local / here.name
        copy.write_text(source)
        moved[path] = str(copy)
    if not moved:
        return config_text
    data = yaml.safe_load(config_text)
    data["plugins"] = [moved.get(entry, entry) for entry in data.get("plugins") or []]
    return yaml.safe_dump(data, sort_keys=False)
