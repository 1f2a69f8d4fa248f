"""`drmas run` with `pipeline.mode=async`: buffer, learners and rollouts as separate local OS processes.

The launcher adds nothing the processes cannot do when started by hand; it only

* claims the output directory (refusing one that holds another run unless resuming or overwriting, see
  `drmas.run_dir`) and builds every model once up front (children would otherwise all build the same
  cached model at once); a model or directory it cannot use ends the run here, with a message, before any
  process starts,
* scores the held-out problems with the initial models before starting anything and with the learners'
  final checkpoints after they finish (`eval.n_problems`; see `drmas.evaluation.async_heldout`),
* replaces every port 0 by a free port and writes the resulting config to `<output_dir>/config.yaml`,
  which every child then loads, so all of them agree on the endpoints,
* starts `drmas-buffer`, one `drmas-learner` per trained model and `pipeline.num_rollouts` rollouts, each in
  a session of its own (a Ctrl-C reaches the launcher only, which then stops them in order),
* merges their output line by line behind a `[name]` prefix (each process also logs to its own directory),
* restarts a process that dies (`drmas.restarts`: bounded, with backoff; a learner with `trainer.resume=true`,
  so it continues from its last checkpoint), and ends the run when every learner has finished, when a
  process cannot be recovered (it refused its input, or used up its restarts; the launcher says which), or
  on SIGINT/SIGTERM: rollouts are stopped first (nothing new is generated), then learners (they write their
  checkpoint), the buffer last (its final counters are logged). A child that ignores SIGTERM for
  `STOP_GRACE_S` is killed.
"""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from drmas import assembly
from drmas.config.load import to_yaml
from drmas.config.schema import DrmasConfig
from drmas.devices import check_ranks
from drmas.endpoints import learner_address
from drmas.process import StopFlag
from drmas.restarts import RestartBook
from drmas.run_dir import claim_output_dir

STOP_GRACE_S = 60.0
_STOP_ORDER = ("rollout", "learner", "buffer")
_RESUME = "trainer.resume=true"


@dataclass
class _Child:
    name: str
    role: str  # buffer, learner or rollout
    module: str
    args: list[str]
    proc: subprocess.Popen | None = None
    pumps: list[threading.Thread] = field(default_factory=list)  # one per start, joined at the end
    restart_at: float | None = None  # set while it waits to be restarted
    finished: bool = False  # a learner that reached its last step


def assign_ports(cfg: DrmasConfig) -> DrmasConfig:
    """A copy of `cfg` in which every port 0 (buffer endpoints, learner weight ports) is a free port."""
    cfg = copy.deepcopy(cfg)
    buf = cfg.pipeline.buffer
    for key in ("producer_endpoint", "consumer_endpoint"):
        parts = urlsplit(getattr(buf, key))
        if parts.scheme == "tcp" and parts.port in (None, 0):
            host = parts.hostname or "127.0.0.1"
            setattr(buf, key, f"tcp://{host}:{_free_port(host)}")
    for model in assembly.trained_models(cfg):
        host, port = learner_address(cfg, model)
        if port == 0:
            cfg.pipeline.learner_ports[model] = _free_port(host)
    return cfg


def _learner_command(cfg: DrmasConfig, model: str, base: list[str]) -> tuple[str, list[str]]:
    """(module, args) of a model's learner: itself, or torchrun starting its `models.<id>.ranks` ranks."""
    args = [*base, "--model", model]
    ranks = cfg.models[model].ranks
    if ranks == 1:
        return "drmas.learner.main", args
    rendezvous = ["--nnodes", "1", "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1",
                  "--master-port", str(_free_port("127.0.0.1"))]
    return "torch.distributed.run", [*rendezvous, "-m", "drmas.learner.main", *args]


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class Launcher:
    def __init__(self, cfg: DrmasConfig, out: TextIO = sys.stdout, python: str = sys.executable) -> None:
        self.cfg = assign_ports(cfg)
        self.out = out
        self.python = python
        self.children: list[_Child] = []
        self.restarts = RestartBook(cfg.pipeline.restarts)
        self._print_lock = threading.Lock()

    def run(self) -> int:
        """0 when every learner finished its steps; 1 when a process could not be recovered; 2 when the run
        could not start (output directory, models); 130 when interrupted."""
        stop = StopFlag()
        try:
            run_dir, config_file = self._prepare()
        except (FileNotFoundError, ValueError, ImportError) as exc:
            print(f"drmas: {exc}", file=sys.stderr)
            return 2
        accuracy = {}
        if not self.cfg.trainer.resume:
            accuracy["before"] = self._heldout("before")
        base = ["--config", str(config_file)]
        try:
            self._start("buffer", "buffer", "drmas.buffer.main", base)
            for model in assembly.trained_models(self.cfg):
                self._start(f"learner-{model}", "learner", *_learner_command(self.cfg, model, base))
            for index in range(self.cfg.pipeline.num_rollouts):
                self._start(f"rollout-{index}", "rollout", "drmas.rollout.main", [*base, "--index", str(index)])
            code = self._watch(stop)
        finally:
            self._stop_all()
        if code == 0:
            from drmas.evaluation.async_heldout import final_checkpoint_dirs

            accuracy["after"] = self._heldout("after", final_checkpoint_dirs(self.cfg))
            self._report_accuracy(run_dir, accuracy)
        self._say("launcher", self._outcome(code, run_dir))
        return code

    def _prepare(self) -> tuple[Path, Path]:
        """Claim the output directory, write the children's config and build every model; raises (with a
        message naming the key or path) what would make the children fail."""
        cfg = self.cfg
        run_dir = claim_output_dir(cfg.trainer.output_dir, cfg.trainer.resume, cfg.trainer.overwrite)
        for model_id in cfg.models:
            assembly.model_path(cfg, model_id)  # build once, here, before the children need it
        for model_id in assembly.trained_models(cfg):  # the learners' ranks run on this machine
            check_ranks(cfg.models[model_id].device, cfg.models[model_id].ranks, f"models.{model_id}.ranks")
        config_file = run_dir / "config.yaml"
        config_file.write_text(to_yaml(cfg))
        return run_dir, config_file

    def _heldout(self, tag: str, model_dirs=None) -> float | None:
        """Held-out accuracy of the initial models ("before") or the final checkpoints ("after")."""
        if self.cfg.eval.n_problems <= 0:
            return None
        from drmas.evaluation.async_heldout import heldout_of_models

        self._say("launcher", f"held-out evaluation ({tag} training, {self.cfg.eval.n_problems} problems)")
        result = heldout_of_models(self.cfg, tag, model_dirs)
        if not result:
            return None
        self._say("launcher", f"held-out accuracy {tag} training: {result['accuracy']:.3f}")
        return result["accuracy"]

    def _report_accuracy(self, run_dir: Path, accuracy: dict) -> None:
        """`eval/accuracy_before` and `eval/accuracy_after` under `<output_dir>/eval/`, as the colocated run logs them."""
        scalars = {f"eval/accuracy_{tag}": value for tag, value in accuracy.items() if value is not None}
        if not scalars:
            return
        from drmas.metrics import MetricsWriter

        writer = MetricsWriter(run_dir / "eval", tensorboard=self.cfg.logging.tensorboard)
        writer.log(self.cfg.trainer.steps, scalars)
        writer.close()
        if "before" in accuracy and "after" in accuracy and None not in (accuracy["before"], accuracy["after"]):
            self._say("launcher", f"held-out accuracy: {accuracy['before']:.3f} -> {accuracy['after']:.3f}")

    def _watch(self, stop: StopFlag) -> int:
        """Supervise the children until every learner has finished (0), one cannot be recovered (1) or a
        signal arrives (130)."""
        learners = [c for c in self.children if c.role == "learner"]
        while not stop.wait(0.2):
            now = time.monotonic()
            for child in self.children:
                if child.finished:
                    continue
                if child.restart_at is not None:
                    if now >= child.restart_at:
                        self._restart(child)
                    continue
                rc = child.proc.poll()
                if rc is None:
                    continue
                if child.role == "learner" and rc == 0:
                    child.finished = True
                    continue
                decision = self.restarts.after_exit(child.name, rc)
                if not decision.restart:
                    self._say("launcher", f"{decision.why}: stopping the run")
                    return 1
                limit = self.cfg.pipeline.restarts.max_restarts
                self._say("launcher", f"{child.name} exited with code {rc}: restarting it in "
                                      f"{decision.delay_s:g} s (restart {decision.attempt} of {limit})")
                child.restart_at = now + decision.delay_s
            if all(c.finished for c in learners):
                return 0
        self._say("launcher", f"{stop.signal_name or 'stop'} received: stopping every process")
        return 130

    def _outcome(self, code: int, run_dir: Path) -> str:
        if code == 0:
            return f"training finished; metrics, TensorBoard and checkpoints under {run_dir}/<process>/"
        return f"run ended with code {code}; logs of every process above, outputs under {run_dir}/"

    # ---- children ----------------------------------------------------------------------------------
    def _start(self, name: str, role: str, module: str, args: list[str]) -> None:
        child = _Child(name, role, module, list(args))
        self.children.append(child)
        self._spawn(child)

    def _restart(self, child: _Child) -> None:
        """Start a dead child again; a learner continues from its last checkpoint (and its version)."""
        child.restart_at = None
        if child.role == "learner" and _RESUME not in child.args:
            child.args.append(_RESUME)
        self._spawn(child)

    def _spawn(self, child: _Child) -> None:
        child.proc = subprocess.Popen(
            [self.python, "-u", "-m", child.module, *child.args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        pump = threading.Thread(target=self._pump, args=(child.name, child.proc), name=f"drmas-log-{child.name}",
                                daemon=True)
        pump.start()
        child.pumps.append(pump)
        self._say("launcher", f"started {child.name} (pid {child.proc.pid})")

    def _pump(self, name: str, proc: subprocess.Popen) -> None:
        """Copy a child's output to ours, each line behind its name (tqdm's \\r updates become lines)."""
        assert proc.stdout is not None
        for raw in proc.stdout:
            for line in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if line.strip():
                    self._say(name, line)

    def _say(self, name: str, line: str) -> None:
        with self._print_lock:
            self.out.write(f"[{name}] {line}\n")
            self.out.flush()

    def _stop_all(self) -> None:
        for role in _STOP_ORDER:
            group = [c for c in self.children if c.role == role and c.proc is not None and c.proc.poll() is None]
            for child in group:
                _signal_group(child.proc, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for child in group:
                try:
                    child.proc.wait(max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    self._say("launcher", f"{child.name} ignored SIGTERM for {STOP_GRACE_S:g}s: killing it")
                    _signal_group(child.proc, signal.SIGKILL)
                    child.proc.wait()
        for child in self.children:
            for pump in child.pumps:
                pump.join(timeout=5)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def launch(cfg: DrmasConfig, out: TextIO = sys.stdout) -> int:
    return Launcher(cfg, out).run()
