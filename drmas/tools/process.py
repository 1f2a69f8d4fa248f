"""One sandboxed run: a fresh working directory, the launcher process (`drmas/tools/confine.py`), its output read
under a cap and a deadline, and the cleanup that happens however the run ends.

The launcher enforces the limits itself (the wall clock included) and reports on a status pipe; this side
only watches: it caps the output (asking the launcher, by SIGTERM, to kill the program), and kills the
launcher's whole process group if it outlives the limit by `BACKSTOP_S` (which only a stuck launcher does).
The working directory is removed in every case, after every process of the run is gone.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from drmas.config.sandbox import SandboxConfig
from drmas.tools.outcome import CONFINEMENT, MAIN, Facts, SandboxRequest, SandboxResult, classify, signal_name

log = logging.getLogger(__name__)

CONFINE = str(Path(__file__).with_name("confine.py"))
BACKSTOP_S = 3.0  # past the wall-clock limit, the launcher itself is killed
DRAIN_S = 1.0  # after the launcher exits, how long its pipes may stay open (a straggler being swept)
_READ = 65536


def environment(workdir: str) -> dict[str, str]:
    """The program's whole environment: nothing of drmas's (no keys, no proxies, no PYTHONPATH)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        # one thread per numeric library: their thread pools would eat the address-space limit
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


@dataclass
class _Streams:
    """stdout and stderr as they arrive: total bytes and the last `keep` bytes of each."""

    keep: int
    total: int = 0
    tails: dict = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})

    def add(self, name: str, data: bytes) -> None:
        self.total += len(data)
        tail = self.tails[name]
        tail += data
        del tail[: max(0, len(tail) - self.keep)]

    def text(self, name: str, chars: int) -> str:
        text = self.tails[name].decode("utf-8", errors="replace")
        return text[len(text) - chars:] if chars else ""


def run_program(
    request: SandboxRequest, config: SandboxConfig, uid: Optional[int], closing: threading.Event
) -> SandboxResult:
    """Run one request under `config`'s limits as `uid` (None: as this process's user); never raises for what
    the program does."""
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="drmas-sandbox-", dir=config.tmp_dir)
    try:
        _write(workdir, request, uid)
        facts, streams = _launch(workdir, config, uid, request.read_back, closing)
        files = _read_back(workdir, request.read_back, config.max_file_mb << 20)
    finally:
        _remove(workdir)
    status, detail = classify(facts, config.timeout_s, config.cpu_s, config.memory_mb, config.max_output_kb)
    msg = facts.messages
    return SandboxResult(
        status=status,
        exit_code=msg.get("exit") if isinstance(msg.get("exit"), int) else None,
        signal=signal_name(msg),
        stdout=streams.text("stdout", config.tail_chars),
        stderr=streams.text("stderr", config.tail_chars),
        detail=detail,
        duration_s=round(time.monotonic() - started, 4),
        cpu_s=float(msg.get("cpu_s", 0.0)) if isinstance(msg.get("cpu_s"), (int, float)) else 0.0,
        max_rss_mb=round(msg.get("max_rss_kb", 0) / 1024, 1) if isinstance(msg.get("max_rss_kb"), int) else 0.0,
        output_bytes=streams.total,
        network=str(msg.get("network", "none")),
        confinement={key: msg[key] for key in CONFINEMENT if key in msg},
        files=files,
    )


def _write(workdir: str, request: SandboxRequest, uid: Optional[int]) -> None:
    for name, text in [(MAIN, request.code), *request.files.items()]:
        path = os.path.join(workdir, name)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        if uid is not None:
            os.chown(path, uid, uid)
    if uid is not None:
        os.chown(workdir, uid, uid)  # mkdtemp made it 0700: the program's uid must own it


def _launch(workdir: str, config: SandboxConfig, uid: Optional[int], read_back: tuple[str, ...],
            closing: threading.Event):
    read_fd, write_fd = os.pipe()
    spec = {
        "status_fd": write_fd, "main": MAIN, "timeout_s": float(config.timeout_s), "cpu_s": config.cpu_s,
        "memory_bytes": config.memory_mb << 20, "file_bytes": config.max_file_mb << 20,
        "open_files": config.max_open_files, "max_processes": config.max_processes,
        "network": list(config.network_isolation), "require_network_isolation": config.require_network_isolation,
        "uid": uid, "gid": uid, "disk_bytes": config.max_disk_mb << 20, "read_back": list(read_back),
    }
    try:
        launcher = subprocess.Popen(
            [config.python or sys.executable, "-I", CONFINE, json.dumps(spec)],
            cwd=workdir, env=environment(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True,
        )
    except OSError as exc:
        os.close(read_fd)
        return Facts(messages={"setup_error": f"could not start the interpreter: {exc}"}), _Streams(0)
    finally:
        os.close(write_fd)
    try:
        return _watch(launcher, os.fdopen(read_fd, "rb", buffering=0), config, closing)
    finally:
        _kill_group(launcher)  # whatever happened above, nothing of the run outlives this call
        launcher.wait()
        for stream in (launcher.stdout, launcher.stderr):
            stream.close()


def _watch(launcher: subprocess.Popen, status, config: SandboxConfig, closing: threading.Event):
    """Read the launcher's stdout, stderr and status pipe until all close, capping output and enforcing the
    backstop deadline; returns the Facts and the streams."""
    facts, streams, status_bytes = Facts(), _Streams(keep=config.tail_chars * 4), bytearray()
    cap = config.max_output_kb << 10
    backstop = time.monotonic() + config.timeout_s + BACKSTOP_S
    drain_until = None
    with selectors.DefaultSelector() as selector, status:
        selector.register(launcher.stdout, selectors.EVENT_READ, "stdout")
        selector.register(launcher.stderr, selectors.EVENT_READ, "stderr")
        selector.register(status, selectors.EVENT_READ, "status")
        while selector.get_map():
            now = time.monotonic()
            if closing.is_set() and not facts.closing:
                facts.closing = True
                launcher.send_signal(signal.SIGTERM)
            if now > backstop and not facts.backstop_killed:
                facts.backstop_killed = True
                _kill_group(launcher)
            if drain_until is None and _exited(launcher):
                drain_until = now + DRAIN_S
            if drain_until is not None and now > drain_until:
                break  # a straggler of the launcher's group holds a pipe: _kill_group ends it
            for key, _ in selector.select(timeout=0.1):
                data = os.read(key.fileobj.fileno(), _READ)
                if not data:
                    selector.unregister(key.fileobj)
                elif key.data == "status":
                    status_bytes += data[: max(0, (1 << 20) - len(status_bytes))]
                else:
                    streams.add(key.data, data)
            if streams.total > cap and not facts.output_limited:
                facts.output_limited = True
                launcher.send_signal(signal.SIGTERM)  # the launcher kills the whole program
                backstop = min(backstop, time.monotonic() + BACKSTOP_S)
    facts.messages = _messages(bytes(status_bytes))
    return facts, streams


def _messages(raw: bytes) -> dict:
    """The status lines merged (later values win); a line the program wrote there that is not a JSON object is
    skipped."""
    merged: dict = {}
    for line in raw.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            merged.update(message)
    return merged


def _exited(launcher: subprocess.Popen) -> bool:
    """Whether the launcher has exited, without reaping it: until `wait` its pid, which is also its process
    group's id, cannot be reused, so killing that group never hits a stranger."""
    return os.waitid(os.P_PID, launcher.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _kill_group(launcher: subprocess.Popen) -> None:
    try:
        os.killpg(launcher.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_back(workdir: str, names: tuple[str, ...], limit: int) -> dict[str, str]:
    """The named files the program left, at most `limit` bytes each; a symlink is not followed (the program
    could point one at a file it may not read, and this process may)."""
    found = {}
    for name in names:
        try:
            fd = os.open(os.path.join(workdir, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                found[name] = handle.read(limit).decode("utf-8", errors="replace")
    return found


def _remove(workdir: str) -> None:
    """Remove the working directory even if the program made parts of it unreadable (chmod 000)."""
    shutil.rmtree(workdir, ignore_errors=True)
    if not os.path.exists(workdir):
        return
    os.chmod(workdir, 0o700)
    for root, dirs, _ in os.walk(workdir):
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
    shutil.rmtree(workdir, ignore_errors=True)
    if os.path.exists(workdir):
        log.warning("sandbox: could not remove the working directory %s", workdir)
