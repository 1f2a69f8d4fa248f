"""The sandboxed code-execution service, with real processes: each limit (wall clock, CPU, memory, processes,
output, file size, open files), what is left behind (child processes, the working directory), the network,
crashes, and a batch where one program misbehaves. The default service takes the namespace way where it works
(root here); the `seccomp` service takes the fallback an unprivileged user without namespaces gets (no pid
namespace: the launcher sweeps stragglers as their subreaper), so both confinement paths are exercised. As root the
seccomp service runs an interpreter every user may read (the system Python where ours is under /root): without
a mount namespace nothing else is shown to the program's uid. What a program must not reach of the host:
tests/test_sandbox_escapes.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from sandbox_harness import (
    IS_ROOT,
    LIMITS,
    SHORT_TIMEOUT_S,
    UNPRIVILEGED,
    assert_nothing_left,
    fallback_python,
    nobody_python,
)
from sandbox_harness import searchable_root
from sandbox_harness import make_service as _service

from drmas.config.sandbox import SandboxConfig
from drmas.tools import SandboxRequest, SandboxService, SandboxUnavailable


@pytest.fixture(scope="module")
def work_root() -> Iterator[Path]:
    with searchable_root() as root:
        yield root


@pytest.fixture(scope="module")
def default_service(work_root):
    with _service(work_root, "default") as service:
        yield service


@pytest.fixture(scope="module")
def seccomp_service(work_root):
    with _service(work_root, "seccomp", network_isolation=["seccomp"], python=fallback_python()) as service:
        yield service


@pytest.fixture(scope="module")
def default_short_service(work_root):
    with _service(work_root, "default-short", timeout_s=SHORT_TIMEOUT_S) as service:
        yield service


@pytest.fixture(scope="module")
def seccomp_short_service(work_root):
    with _service(work_root, "seccomp-short", timeout_s=SHORT_TIMEOUT_S, network_isolation=["seccomp"],
               python=fallback_python()) as service:
        yield service


@pytest.fixture(params=["default", "seccomp"])
def service(request) -> SandboxService:
    return request.getfixturevalue(f"{request.param}_service")


@pytest.fixture
def short_service(request, service) -> SandboxService:
    """`service`'s kind with a wall clock of SHORT_TIMEOUT_S, for the programs that must run into it."""
    return request.getfixturevalue(f"{request.node.callspec.params['service']}_short_service")


@pytest.fixture(autouse=True)
def nothing_left(request):
    """After every test: no process of a run still alive, no working directory left."""
    yield
    for name in ("default_service", "seccomp_service", "default_short_service", "seccomp_short_service"):
        if name in request.fixturenames:
            assert_nothing_left(request.getfixturevalue(name))


def test_a_program_runs_and_reports(service):
    result = service.run("import os, sys\nprint('hello', os.getpid())\nprint('oops', file=sys.stderr)\nsys.exit(0)")
    assert (result.status, result.exit_code, result.stderr) == ("ok", 0, "oops\n")
    said, pid = result.stdout.split()
    assert said == "hello" and (pid == "2") == (result.confinement["processes"] == "pid_namespace")
    assert result.duration_s > 0 and result.output_bytes == len(result.stdout) + len("oops\n")
    failed = service.run("def f():\n    raise ValueError('bad input')\nf()")
    assert (failed.status, failed.exit_code) == ("error", 1)
    assert failed.stderr.startswith('Traceback (most recent call last):\n  File "main.py", line 3')  # its frames only
    assert failed.stderr.endswith("ValueError: bad input\n")
    assert service.run("raise SystemExit(3)").exit_code == 3


def test_infinite_loop_times_out(short_service):
    result = short_service.run("while True:\n    pass")
    assert result.status == "timeout" and "wall-clock" in result.detail
    assert SHORT_TIMEOUT_S <= result.duration_s < SHORT_TIMEOUT_S + 5  # at its limit, however loaded the machine


def test_cpu_limit(work_root):
    # a wall clock far behind: a loaded machine may give the loop a fraction of a core, never 30 s for 1 s of CPU
    with _service(work_root, "cpu", cpu_s=1, timeout_s=60, workers=1) as service:
        result = service.run("while True:\n    pass")
    assert result.status == "timeout" and "CPU limit of 1 s" in result.detail, result
    assert result.duration_s < 30


def test_ten_gigabytes_is_a_memory_result(service):
    result = service.run("data = bytearray(10 * 2**30)\nprint('allocated')")
    assert result.status == "memory" and result.stdout == ""
    assert result.stderr.rstrip().endswith("MemoryError")


def test_crashes_are_reported(service):
    segfault = service.run("import ctypes\nctypes.string_at(0)")
    abort = service.run("import os\nos.abort()")
    assert (segfault.status, segfault.signal) == ("crashed", "SIGSEGV")
    assert (abort.status, abort.signal) == ("crashed", "SIGABRT")


def test_output_is_capped(service):
    result = service.run("import sys\nwhile True:\n    sys.stdout.write('x' * 1000)")
    assert result.status == "output_limit"
    assert result.output_bytes > 64 * 1024 and result.stdout == "x" * 2000  # the tail only
    assert result.duration_s < LIMITS["timeout_s"]  # killed at the cap, not at the wall-clock limit


def test_file_size_and_open_files_limits(service):
    big = service.run("open('big', 'wb').write(b'x' * (2 << 20))")
    files = service.run("handles = [open('f%d' % i, 'w') for i in range(100)]")
    assert big.status == "error" and "File too large" in big.stderr
    assert files.status == "error" and "Too many open files" in files.stderr


def test_disk_is_capped_and_private_with_namespaces(service):
    """With a mount namespace the working directory and /tmp are tmpfs mounts of max_disk_mb each: a program
    cannot fill the disk, and what it puts in /tmp or /dev/shm is gone with it."""
    if service.probe.network == "seccomp":
        pytest.skip("no mount namespace on the seccomp path: only each file is capped")
    assert service.probe.confinement["disk"] == "tmpfs"  # wherever the namespaces are, the mounts work
    marker = f"drmas-sandbox-test-{os.getpid()}-{time.monotonic_ns()}"
    code = f"""
import os
for place in ('/tmp', '/dev/shm'):
    open(os.path.join(place, '{marker}'), 'w').write('x')
written = 0
try:
    for i in range(10):
        open('part%d' % i, 'wb').write(b'x' * (1 << 20))
        written += 1
except OSError as exc:
    print(exc.strerror, written)
"""
    result = service.run(code)
    assert result.status == "ok", result
    reason, written = result.stdout.rsplit(" ", 1)
    assert reason == "No space left on device" and int(written) == 4  # 4 MiB files of 1 MiB, then ENOSPC
    assert not os.path.exists(f"/tmp/{marker}") and not os.path.exists(f"/dev/shm/{marker}")
    if service.probe.confinement["read_only_host"] and os.path.isdir("/var/tmp"):  # world-writable on the host
        elsewhere = service.run(f"open('/var/tmp/{marker}', 'w')")
        assert "Read-only file system" in elsewhere.stderr and not os.path.exists(f"/var/tmp/{marker}")


_BACKGROUND = """
import os, sys, time
def identity():  # the host's pid and start time (/proc is the host's, so /proc/self names the host pid)
    with open('/proc/self/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return os.readlink('/proc/self'), fields[19]
if os.fork() == 0:
    if {daemonise}:
        os.setsid()
        if os.fork():
            os._exit(0)
    print('pid', *identity(), flush=True)
    time.sleep(60)
    os._exit(0)
time.sleep(0.3)  # let it report, then end while it sleeps
"""


@pytest.mark.parametrize("daemonise", [False, True], ids=["child", "daemonised-grandchild"])
def test_processes_left_behind_are_killed(service, daemonise):
    started = time.monotonic()
    result = service.run(_BACKGROUND.format(daemonise=daemonise))
    # not held up by what it left behind (asleep for 60 s): it ended on its own, before its wall clock
    assert result.status == "ok" and time.monotonic() - started < LIMITS["timeout_s"], result
    assert not _alive(result.stdout)


def _alive(report: str) -> bool:
    """Whether the process a program reported ('pid HOSTPID STARTTIME') still runs (same pid, same start, not a
    zombie waiting to be reaped)."""
    _, pid, start_time = report.split()
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[19] == start_time and fields[0] != "Z"


_COUNT_FORKS = """
import os, time
forked = 0
try:
    for _ in range(100):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        forked += 1
except OSError as exc:
    print(exc.errno, forked)
"""


def test_fork_bomb_is_contained(service, short_service):
    if not service.probe.confinement.get("process_limit"):
        pytest.skip("programs run as root here: RLIMIT_NPROC does not apply (uid_base is null)")
    counted = service.run(_COUNT_FORKS)
    errno, forked = map(int, counted.stdout.split())
    assert errno == 11 and 1 <= forked <= 8 - 1  # EAGAIN: at most max_processes, the program included
    bomb = short_service.run("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass")
    assert bomb.status == "timeout" and bomb.duration_s < SHORT_TIMEOUT_S + 5


def test_network_is_refused(service):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        result = service.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('in')")
        with pytest.raises(socket.timeout):
            listener.accept()
    assert result.status == "error" and "in" not in result.stdout
    assert result.network in ("netns", "seccomp") and result.network == service.probe.network
    expected = "Network is unreachable" if result.network == "netns" else "Operation not permitted"
    assert expected in result.stderr


def test_seccomp_refuses_signalling_every_process(seccomp_service):
    """Without a pid namespace kill(-1) would reach every process of the user (for a user without root: the
    trainer too); the filter refuses it, while signalling the program's own processes works."""
    result = seccomp_service.run("import os, signal\nos.kill(os.getpid(), 0)\nos.kill(-1, signal.SIGKILL)")
    assert result.status == "error" and "PermissionError" in result.stderr, result


def test_working_directory_is_private_and_removed(service, short_service):
    code = """
import os
print(os.getcwd())
os.makedirs('a/b')
open('a/b/data', 'w').write('x')
os.chmod('a', 0)  # not even listable: removal must cope
print(sorted(os.environ))
"""
    result = service.run(code)
    workdir, env = result.stdout.splitlines()
    assert result.status == "ok" and workdir.startswith(service.config.tmp_dir)
    assert not os.path.exists(workdir)
    assert env == str(sorted(["PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                              "MKL_NUM_THREADS"]))  # nothing of ours: no PYTHONPATH, no keys
    killed = short_service.run("import os, time\nprint(os.getcwd(), flush=True)\ntime.sleep(60)")
    assert killed.status == "timeout" and not os.path.exists(killed.stdout.strip())


def test_stdin_is_closed(service):
    result = service.run("input()")
    assert result.status == "error" and "EOFError" in result.stderr


@pytest.mark.skipif(not IS_ROOT, reason="programs keep the caller's uid when it is not root")
def test_root_drops_to_a_uid_of_its_own(default_service):
    result = default_service.run("import os\nprint(os.getuid(), os.getgid())\nopen('/etc/drmas-sandbox-test', 'w')")
    uid, gid = map(int, result.stdout.split())
    base = default_service.config.uid_base
    assert base <= uid < base + default_service.config.workers and gid == uid
    refused = "Read-only file system" if default_service.probe.confinement.get("read_only_host") else "PermissionError"
    assert result.status == "error" and refused in result.stderr
    assert not os.path.exists("/etc/drmas-sandbox-test")


def test_files_in_and_out(service):
    request = SandboxRequest(
        code="import helper, os\nopen('out.txt', 'w').write(helper.greet())\nos.symlink('/etc/hostname', 'link')",
        files={"helper.py": "def greet():\n    return 'hi from helper'\n"},
        read_back=("out.txt", "link", "missing.txt"),
    )
    result = service.run(request)
    assert result.status == "ok", result
    assert result.files == {"out.txt": "hi from helper"}  # the symlink is not followed, a missing file skipped


def test_bad_requests_are_rejected_not_raised(default_service):
    results = default_service.call_batch([SandboxRequest("print(1)", files={"../escape.py": ""}), 42, "print(2)"])
    assert [r.status for r in results] == ["rejected", "rejected", "ok"]
    assert "../escape.py" in results[0].detail and "int" in results[1].detail


def test_a_batch_with_misbehaving_programs(default_short_service):
    requests = ["print(1)", "while True: pass", "print(2)", "data = bytearray(10 * 2**30)", "import os; os.abort()",
                "print(3)"]
    started = time.monotonic()
    results = default_short_service.call_batch(requests)
    assert [r.status for r in results] == ["ok", "timeout", "ok", "memory", "crashed", "ok"]
    assert [r.stdout for r in results if r.ok] == ["1\n", "2\n", "3\n"]
    assert time.monotonic() - started < SHORT_TIMEOUT_S + 2.0  # in parallel: the loop's limit, not a sum of runs


def test_closing_kills_running_programs(work_root):
    service = _service(work_root, "closing", timeout_s=30)
    results = []
    runner = threading.Thread(target=lambda: results.extend(service.call_batch(["import time\ntime.sleep(60)"] * 2)))
    runner.start()
    time.sleep(0.5)
    started = time.monotonic()
    service.close()
    runner.join(60)
    # killed at once: not after their 60 s sleep, nor at the service's 30 s wall clock
    assert [r.status for r in results] == ["killed", "killed"] and time.monotonic() - started < 20
    assert_nothing_left(service)
    assert [r.status for r in service.call_batch(["print(1)"])] == ["killed"]  # closed: nothing runs any more


def _with_marker(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (a launcher's spec names the request's read-back files,
    and the program is a fork of the launcher)."""
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                if marker.encode() in handle.read():
                    found.append(int(name))
        except OSError:
            pass
    return found


def test_programs_die_with_the_drmas_process(tmp_path):
    """A trainer killed outright (SIGKILL) takes its running programs along: the launchers get a parent-death
    signal and kill theirs."""
    marker = f"marker-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        "from drmas.config.sandbox import SandboxConfig\n"
        "from drmas.tools import SandboxRequest, SandboxService\n"
        f"service = SandboxService(SandboxConfig(timeout_s=60, tmp_dir={str(tmp_path)!r}))\n"
        f"service.run(SandboxRequest('import time\\ntime.sleep(60)', read_back=({marker!r},)))\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", script])
    try:
        started = lambda: [pid for pid in _with_marker(marker) if pid != trainer.pid]  # noqa: E731
        deadline = time.monotonic() + 60
        while len(started()) < 2 and time.monotonic() < deadline:  # the launcher and the program (and reaper)
            time.sleep(0.05)
        assert len(started()) >= 2
        trainer.kill()
        trainer.wait()
        deadline = time.monotonic() + 30  # the kill lands at once; a loaded machine may take a while to show it
        while _with_marker(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _with_marker(marker) == []
    finally:
        trainer.kill()
        for pid in _with_marker(marker):
            os.kill(pid, 9)


def test_no_network_isolation_is_refused_or_reported(work_root, caplog):
    with pytest.raises(SandboxUnavailable, match=r"test\.none: .*require_network_isolation"):
        _service(work_root, "none", network_isolation=[])
    with caplog.at_level("WARNING"), _service(work_root, "none", network_isolation=[], python=fallback_python(),
                                            require_network_isolation=False) as service:
        assert service.run("print(1)").network == "none"
    assert "NOT isolated from the network" in caplog.text


def test_config_problems_name_the_key():
    problems = SandboxConfig(workers=0, timeout_s=-1, memory_mb=True, network_isolation=["netns", "vpn"],
                             uid_base=-5).problems("system.sandbox")
    for key in ("workers", "timeout_s", "memory_mb", "network_isolation", "uid_base"):
        assert any(p.startswith(f"system.sandbox.{key}:") for p in problems), (key, problems)
    with pytest.raises(ValueError, match="x.workers"):
        SandboxService(SandboxConfig(workers=0), where="x")


def test_config_methods_are_the_launchers():
    from drmas.config.sandbox import NETWORK_ISOLATION
    from drmas.tools import confine

    assert NETWORK_ISOLATION == confine.METHODS


@pytest.mark.skipif(not (IS_ROOT and UNPRIVILEGED), reason="needs root, setpriv and /usr/bin/python3")
def test_an_unprivileged_user(work_root, tmp_path):
    """What a user without root gets: the launcher started as uid 65534 (through a wrapper interpreter that
    hands it the working directory and drops root), so the user-namespace path and RLIMIT_NPROC counted
    over the uid's processes are the real ones. The system Python, since another user may not read ours."""
    with (socket.socket() as listener,
          _service(work_root, "nobody", python=nobody_python(tmp_path), uid_base=None) as service):
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        net = service.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        forks = service.run(_COUNT_FORKS)
        daemon = service.run(_BACKGROUND.format(daemonise=True))
        files = service.run(SandboxRequest("open('out.txt', 'w').write('hi')", read_back=("out.txt",)))
    if service.probe.network != "userns":
        pytest.skip(f"user namespaces are not available to an unprivileged user here ({service.probe.network} held)")
    assert service.probe.confinement["uid"] == 65534 and service.probe.confinement["process_limit"] is True
    assert service.probe.confinement["disk"] == "tmpfs" and files.files == {"out.txt": "hi"}
    assert service.probe.confinement["read_only_host"] is True
    assert net.status == "error" and "Network is unreachable" in net.stderr
    errno, forked = map(int, forks.stdout.split())
    assert errno == 11 and 1 <= forked <= 8 - 1
    assert daemon.status == "ok" and not _alive(daemon.stdout)
    assert os.listdir(service.config.tmp_dir) == []
