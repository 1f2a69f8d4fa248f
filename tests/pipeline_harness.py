"""Helpers of the multi-process pipeline tests: free ports, child processes that are always killed, overrides.

Each process is started with `sys.executable -m ...` in a session of its own so that `kill_all` can SIGKILL
its whole process group in a test's `finally`, whatever happened.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from drmas import assembly
from drmas.config import read_config

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "configs" / "smoke.yaml"
SMOKE_ASYNC = ROOT / "configs" / "smoke_async.yaml"


@pytest.fixture(scope="module")
def smoke_model() -> Path:
    """Build the smoke model in the session cache before any child process needs it."""
    return assembly.model_path(read_config(SMOKE), "policy")


@pytest.fixture(scope="module")
def smoke_async_models() -> list[Path]:
    """Build both models of configs/smoke_async.yaml before any child process needs them."""
    cfg = read_config(SMOKE_ASYNC)
    return [assembly.model_path(cfg, model) for model in cfg.models]


def free_ports(n: int) -> list[int]:
    """n distinct ports free right now (held open together so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Processes:
    """Child processes of one test, each in its own session so its whole group can be killed."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, module: str, *args: str) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log, stderr=subprocess.STDOUT,
                                cwd=ROOT, start_new_session=True)
        log.close()
        self.procs[name] = proc
        return proc

    def stop(self, name: str, timeout: float) -> int:
        """SIGTERM (a clean stop) and the exit code; SIGKILL and fail if it does not come in time."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name} ignored SIGTERM for {timeout}s\n{self.tail(name)}")

    def kill9(self, name: str) -> None:
        """kill -9 a child's whole process group (no clean stop, no checkpoint) and reap it."""
        os.killpg(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait(10)

    def tail(self, name: str, lines: int = 30) -> str:
        text = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        return f"--- {name} ---\n" + "\n".join(text[-lines:])

    def tails(self) -> str:
        return "\n".join(self.tail(name) for name in self.procs)

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(10)


def pipeline_overrides(out: Path, max_staleness: int, steps: int, models: tuple[str, ...] = ("policy",)) -> list[str]:
    """Overrides of a hand-started pipeline on free loopback ports with short timeouts; `models` are the
    trained models (one weight-sync port each)."""
    producer_port, consumer_port, *weight_ports = free_ports(2 + len(models))
    learner_ports = ", ".join(f"{model}: {port}" for model, port in zip(models, weight_ports))
    return [
        f"trainer.output_dir={out}", f"trainer.steps={steps}", "trainer.threads=1", "logging.tensorboard=false",
        f"pipeline.max_staleness={max_staleness}", "pipeline.report_interval_s=0.5",
        f"pipeline.buffer.producer_endpoint=tcp://127.0.0.1:{producer_port}",
        f"pipeline.buffer.consumer_endpoint=tcp://127.0.0.1:{consumer_port}",
        f"pipeline.learner_ports={{{learner_ports}}}",
        "pipeline.weights.timeout_s=10", "pipeline.weights.ready_timeout_s=10", "pipeline.weights.join_retry_s=0.2",
        "pipeline.weights.heartbeat_s=0.25", "pipeline.weights.peer_timeout_s=3",
    ]


