"""The local launcher (`pipeline.launcher=local`): buffer, learners and rollouts as OS processes of this machine.

It adds nothing the processes cannot do when started by hand; what it shares with every launcher (output
directory, models, held-out evaluation, restarts, stop order) is `drmas.launch.supervisor`. Here:

* every port 0 (the default) is replaced by a free port of this machine (`assign_ports`), and the resulting
  config is written to `<output_dir>/config.yaml`, which every child then loads, so all of them agree on the
  endpoints; a port the config fixes must be free here, and a device it names present, before anything starts,
* a learner with `models.<id>.ranks` > 1 is started through torchrun (its ranks on this machine's GPUs or
  cores, checked before anything starts),
* under `pipeline.gpus` each learner and rollout sees its own GPUs (`drmas.launch.gpus`),
* every child runs in a session of its own (a Ctrl-C reaches the launcher only, which then stops them in
  order), its output copied to ours by a thread per process.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional, TextIO
from urllib.parse import urlsplit

from drmas import assembly
from drmas.config.derived import model_config
from drmas.config.schema import DrmasConfig
from drmas.launch.gpus import GpuAssignment, visible_gpus
from drmas.launch.supervisor import Child, Supervisor
from drmas.models.devices import check_ranks, resolve_device
from drmas.runtime.endpoints import BUFFER_ENDPOINTS, learner_address, unusable_ports
from drmas.runtime.launcher_watch import launcher_env
from drmas.runtime.process import QUIET_PROGRESS_ENV


def assign_ports(cfg: DrmasConfig) -> DrmasConfig:
    """A copy of `cfg` in which every port 0 (buffer endpoints, learner weight ports) is a free port."""
    cfg = copy.deepcopy(cfg)
    buf = cfg.pipeline.buffer
    for key in BUFFER_ENDPOINTS:
        parts = urlsplit(getattr(buf, key))
        if parts.scheme == "tcp" and parts.port in (None, 0):
            host = parts.hostname or "127.0.0.1"
            setattr(buf, key, f"tcp://{host}:{free_port(host)}")
    for model in assembly.trained_models(cfg):
        host, port = learner_address(cfg, model)
        if port == 0:
            cfg.pipeline.learner_ports[model] = free_port(host)
    return cfg


def learner_command(ranks: int, module: str, args: list[str]) -> tuple[str, list[str]]:
    """(module, args) of a learner: itself, or torchrun starting its `ranks` ranks on this machine."""
    if ranks == 1:
        return module, args
    rendezvous = ["--nnodes", "1", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
                  "--master-port", str(free_port("127.0.0.1"))]
    return "torch.distributed.run", [*rendezvous, "-m", module, *args]


def free_port(host: str) -> int:
    return free_ports(host, 1)[0]


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports free on this machine for `host` (all probed at once, so none repeats)."""
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind((host, 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def child_command(python: str, module: str, config: str, args: list[str], ranks: int) -> list[str]:
    """The command line of a pipeline process (`ranks` > 1: a learner under torchrun)."""
    module, args = learner_command(ranks, module, ["--config", config, *args])
    return [python, "-u", "-m", module, *args]


def pump_lines(stream, emit) -> None:
    """Hand each line of a child's output to `emit` (a \\r still written by a bar ends a line; blank lines dropped)."""
    for raw in stream:
        for line in raw.decode(errors="replace").replace("\r", "\n").splitlines():
            if line.strip():
                emit(line)


def popen_session(command: list[str], env: Optional[dict] = None, **kwargs) -> subprocess.Popen:
    """A child in a session of its own, output piped (stderr merged), no stdin, and no progress bars (each of
    their updates would be a line of the merged log). It watches this process and stops once it is gone
    (`drmas.runtime.launcher_watch`): in a session of its own, no signal to this one's group reaches it."""
    env = {**(os.environ if env is None else env), **QUIET_PROGRESS_ENV, **launcher_env()}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env, **kwargs)


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class LocalChild(Child):
    launcher: Optional["LocalLauncher"] = None
    proc: Optional[subprocess.Popen] = None
    pumps: list[threading.Thread] = field(default_factory=list)  # one per start, joined at the end

    def spawn(self) -> str:
        launcher = self.launcher
        ranks = model_config(launcher.cfg, self.args[1]).ranks if self.role == "learner" else 1
        gpus = launcher.gpus_of(self.role, self.args)
        env = None if gpus is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpus}
        self.proc = popen_session(child_command(launcher.python, self.module, str(launcher.config_file), self.args,
                                                ranks), env=env)
        pump = threading.Thread(target=pump_lines, args=(self.proc.stdout, lambda line: launcher._say(self.name, line)),
                                name=f"drmas-log-{self.name}", daemon=True)
        pump.start()
        self.pumps.append(pump)
        self.pids.append(self.proc.pid)
        return "" if gpus is None else f" on GPUs {gpus}"

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def terminate(self) -> None:
        signal_group(self.proc, signal.SIGTERM)

    def kill(self) -> None:
        signal_group(self.proc, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        for pump in self.pumps:
            pump.join(timeout=5)


class LocalLauncher(Supervisor):
    def __init__(self, cfg: DrmasConfig, out: TextIO = sys.stdout, python: str = sys.executable) -> None:
        super().__init__(cfg, out)
        self.python = python
        self.gpus: GpuAssignment | None = None  # pipeline.gpus, checked against the GPUs we see

    def _check_machine(self) -> None:
        """Every process runs here: the packages (vLLM) and devices the config asks for must be here, and so must
        the ports it fixes (free, on an address of this machine). Refused before any process starts, naming the
        key."""
        cfg = self.cfg
        assembly.require_packages(cfg)
        for model_id, mcfg in cfg.models.items():
            resolve_device(mcfg.device, f"models.{model_id}.device")
        for model_id in assembly.trained_models(cfg):  # the learners' ranks run on this machine
            mcfg = model_config(cfg, model_id)
            check_ranks(mcfg.device, mcfg.ranks, f"models.{model_id}.ranks")
        if cfg.pipeline.gpus.active():
            self.gpus = GpuAssignment(cfg.pipeline.gpus, visible_gpus())
        problems = unusable_ports(cfg, assembly.trained_models(cfg))
        if problems:
            raise ValueError("\n  ".join(problems))

    def gpus_of(self, role: str, args: list[str]) -> str | None:
        """A child's own CUDA_VISIBLE_DEVICES under `pipeline.gpus`, or None: it sees what we see."""
        if self.gpus is not None and role == "learner":
            return self.gpus.for_learner(args[1])  # args: --model ID
        if self.gpus is not None and role == "rollout":
            return self.gpus.for_rollout(int(args[1]))  # args: --index I
        return None

    def _place(self) -> None:
        self.cfg = assign_ports(self.cfg)

    def _child(self, name: str, role: str, module: str, args: list[str]) -> Child:
        return LocalChild(name, role, module, args, launcher=self)
