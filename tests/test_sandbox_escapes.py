"""Escape probes (issue 33): what a sandboxed program must not reach of the host, each probe a program that
tries every way it knows and prints the ones that worked. The ways: a path itself; the host's root directory
reached by a file handle (open_by_handle_at) through each mount the program holds a descriptor of (an
inherited one, or '/'), named as /proc/self/fd/N/...; and /proc/1/root.

Run with the default service (namespaces; as root here, so the program runs as a uid of its own), the seccomp
fallback (no namespaces: it cannot hide files, so the probes of what only a mount or pid namespace hides
are skipped there), and, as root, the whole service as uid 65534 (the user-namespace path). The host's secrets
are files, sockets and processes the test makes itself, under a fresh directory each. Then the interpreter
and the working directory as root: shown to the program's uid with namespaces (and nothing else of the
directory that hid them), a clear refusal without.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest
from sandbox_harness import IS_ROOT, NOBODY, UNPRIVILEGED, assert_nothing_left, fallback_python, make_service
from sandbox_harness import nobody_python, searchable_root

from drmas.tools import SandboxService, SandboxUnavailable

SERVICES = ("default", "seccomp", "nobody")

# defines `leaks` (what worked), `routes(path)`, `by_handle(handle, flags)`, `handle(path)`, `attempt(what, f)`
# and INHERITED (the descriptors the program found open besides 0, 1, 2: fd -> file type), all found before
# the prelude opens its own
PRELUDE = r'''
import ctypes, os, signal, socket, stat, struct
libc = ctypes.CDLL(None, use_errno=True)
leaks = []

def _open_fds():
    found = {}
    for fd in range(3, 256):
        try:
            found[fd] = stat.S_IFMT(os.fstat(fd).st_mode)
        except OSError:
            pass
    return found

INHERITED = _open_fds()

def handle(path):
    buf = ctypes.create_string_buffer(8 + 128)
    struct.pack_into('I', buf, 0, 128)
    mount_id = ctypes.c_int()
    return buf if libc.name_to_handle_at(-100, path.encode(), buf, ctypes.byref(mount_id), 0) == 0 else None

# the mounts held: '/' and each inherited directory (reopened: open_tree's descriptors are O_PATH ones)
MOUNTS = [os.open('/', os.O_RDONLY)] + [os.open('.', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                                        for fd, kind in INHERITED.items() if kind == stat.S_IFDIR]

def by_handle(found, flags):
    opened = [libc.open_by_handle_at(mount_fd, found, flags) for mount_fd in MOUNTS]
    return [fd for fd in opened if fd >= 0]

_ROOT = handle('/')
ROOTS = [] if _ROOT is None else by_handle(_ROOT, os.O_RDONLY | os.O_DIRECTORY)

def routes(path):
    return [path, '/proc/1/root' + path] + ['/proc/self/fd/%d%s' % (fd, path) for fd in ROOTS]

def attempt(what, action):
    try:
        action()
    except OSError:
        return
    leaks.append(what)
'''

PROBES = {
    # 1. a root-only file of the host
    "etc_shadow": """
for way in routes('/etc/shadow'):
    attempt(way, lambda: open(way, 'rb').read())
""",
    # 2. a 0600 secret under the host's /tmp (a CURVE secret key)
    "tmp_secret": """
for way in routes('{secret}'):
    attempt(way, lambda: open(way, 'rb').read())
""",
    # 3. a world-readable checkpoint under the host's /tmp
    "tmp_checkpoint": """
for way in routes('{checkpoint}'):
    attempt(way, lambda: open(way, 'rb').read())
""",
    # 4. a file left in a world-writable directory of the host
    "world_writable": """
for i, way in enumerate(routes('{drop}')):
    attempt(way, lambda: os.close(os.open(way + '/left-%d' % i, os.O_WRONLY | os.O_CREAT, 0o644)))
""",
    # 5. 24 MiB to the host's disk past max_disk_mb=4, through a descriptor of the host working directory
    "disk_cap": """
targets = [fd for fd, kind in INHERITED.items() if kind == stat.S_IFDIR]
for way in routes(os.getcwd())[2:]:
    attempt(way, lambda: targets.append(os.open(way, os.O_RDONLY | os.O_DIRECTORY)))
for target in targets:
    written = 0
    try:
        for i in range(24):
            fd = os.open('escape%d' % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=target)
            with open(fd, 'wb') as out:
                out.write(b'x' * (1 << 20))
            written += 1
    except OSError:
        pass
    if written:
        leaks.append('%d MiB through fd %d' % (written, target))
""",
    # 5b. no descriptor but 0, 1, 2 and the status pipe
    "descriptors": """
if sorted(INHERITED.values()) != [stat.S_IFIFO]:
    leaks.append(INHERITED)
""",
    # 6. a host Unix socket under /tmp that every user may connect to
    "tmp_socket": """
for way in routes('{socket}'):
    client = socket.socket(socket.AF_UNIX)
    attempt(way, lambda: client.connect(way))
    client.close()
""",
    # 6b. the same under /run, where the host's daemons listen
    "run_socket": """
for way in routes('{run_socket}'):
    client = socket.socket(socket.AF_UNIX)
    attempt(way, lambda: client.connect(way))
    client.close()
""",
    # 7. open_by_handle_at on inodes of the root filesystem: a handle made here, and one the test made outside
    "file_handle": """
outside = bytes.fromhex('{handle}')
for name, found in (('/etc/shadow', handle('/etc/shadow')), ('outside', ctypes.create_string_buffer(outside))):
    if found is not None:
        leaks += [name for fd in by_handle(found, os.O_RDONLY)]
""",
    # 8. host processes' command lines and environments, by a scan of /proc and by the host pid
    "host_processes": """
for name in filter(str.isdigit, os.listdir('/proc')):
    for part in ('cmdline', 'environ'):
        try:
            if b'{marker}' in open('/proc/%s/%s' % (name, part), 'rb').read():
                leaks.append('/proc/%s/%s' % (name, part))
        except OSError:
            pass
attempt('cmdline of {pid}', lambda: open('/proc/{pid}/cmdline', 'rb').read())
attempt('cwd of {pid}', lambda: os.listdir('/proc/{pid}/cwd'))
""",
    # 9. signalling or tracing a host process of the program's own uid where there is one (uid 65534)
    "signal_host": """
attempt('kill', lambda: os.kill({pid}, signal.SIGTERM))
if libc.ptrace(16, {pid}, None, None) == 0:  # PTRACE_ATTACH
    leaks.append('ptrace')
""",
    # 10. taking the namespace's mounts apart: the tmpfs and /proc unmounted, the host turned writable again,
    # also from a user namespace of the program's own
    "undo_mounts": """
for target in ('/tmp', '/proc', os.getcwd()):
    if libc.umount2(target.encode(), 2) == 0:  # MNT_DETACH
        leaks.append('umount ' + target)
if libc.mount(None, b'/', None, 32 | 4096, None) == 0:  # MS_REMOUNT | MS_BIND without MS_RDONLY
    leaks.append('remount / writable')
child = os.fork()
if child == 0:
    own = libc.unshare(0x10000000 | 0x20000) == 0  # CLONE_NEWUSER | CLONE_NEWNS
    os._exit(int(own and (libc.umount2(b'/tmp', 2) == 0 or libc.mount(None, b'/', None, 32 | 4096, None) == 0)))
if os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]):
    leaks.append('from a user namespace of its own')
""",
}
# what only a mount or pid namespace hides: the seccomp fallback leaves these open (docs/sandbox.md)
NAMESPACES_ONLY = {"tmp_checkpoint", "world_writable", "tmp_socket", "run_socket", "host_processes", "undo_mounts"}


@pytest.fixture(scope="module")
def work_root() -> Iterator[Path]:
    with searchable_root() as root:
        yield root


@pytest.fixture(scope="module")
def services(work_root):
    made = {}
    try:
        made["default"] = make_service(work_root, "default")
        made["seccomp"] = make_service(work_root, "seccomp", network_isolation=["seccomp"], python=fallback_python())
        if IS_ROOT and UNPRIVILEGED:
            made["nobody"] = make_service(work_root, "nobody", python=nobody_python(work_root), uid_base=None)
        yield made
    finally:
        for service in made.values():
            service.close()


@pytest.fixture
def host():
    """The host's secrets, made afresh for each probe, each in a directory of its own under /tmp (a handle of one
    computed here), a socket in one and one under /run (as root), and a `sleep` per uid whose command line and
    environment carry a marker."""
    made, listeners, sleepers = [], [], {}
    marker = f"drmas-escape-{os.getpid()}-{time.monotonic_ns()}"

    def directory(mode: int, parent: str = "/tmp") -> str:
        path = tempfile.mkdtemp(prefix="drmas-escape-", dir=parent)
        os.chmod(path, mode)
        made.append(path)
        return path

    def secret(name: str, mode: int) -> str:
        path = os.path.join(directory(0o755), name)
        with open(path, "w") as handle:
            handle.write("secret")
        os.chmod(path, mode)
        return path

    def listening(parent: str) -> tuple[str, socket.socket]:
        path = os.path.join(directory(0o755, parent), "sock")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        os.chmod(path, 0o777)  # anyone may connect (as an X server's, or a bus's)
        listener.listen(8)
        listener.setblocking(False)
        listeners.append(listener)
        return path, listener

    try:
        found = {"secret": secret("curve.key_secret", 0o600), "checkpoint": secret("model.ckpt", 0o644),
                 "drop": directory(0o1777), "marker": marker}
        found["handle"] = _handle(found["secret"]).hex()
        found["socket"], found["socket_listener"] = listening("/tmp")
        if IS_ROOT and os.path.isdir("/run"):
            found["run_socket"], found["run_listener"] = listening("/run")
        for uid in (0, NOBODY) if IS_ROOT and UNPRIVILEGED else (os.getuid(),):  # `sleep 120` named `marker`
            as_uid = dict(user=uid, group=uid, extra_groups=[]) if IS_ROOT else {}
            sleepers[uid] = subprocess.Popen([marker, "120"], executable=shutil.which("sleep"), env={"PROBE": marker},
                                             **as_uid)
        found["sleepers"] = sleepers
        yield found
    finally:
        for process in sleepers.values():
            process.kill()
            process.wait()
        for listener in listeners:
            listener.close()
        for path in made:
            shutil.rmtree(path, ignore_errors=True)


def _handle(path: str) -> bytes:
    """name_to_handle_at(path): struct file_handle (its size, type and bytes)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(8 + 128)
    struct.pack_into("I", buf, 0, 128)
    mount_id = ctypes.c_int()
    if libc.name_to_handle_at(-100, path.encode(), buf, ctypes.byref(mount_id), 0) != 0:
        return b""
    size = struct.unpack_from("I", buf, 0)[0]
    return buf.raw[: 8 + size]


def _tool_for(services: dict, name: str) -> SandboxService:
    if name not in services:
        pytest.skip("the unprivileged user needs root, setpriv and /usr/bin/python3")
    return services[name]


@pytest.mark.parametrize("probe", sorted(PROBES))
@pytest.mark.parametrize("name", SERVICES)
def test_escape_probe(services, host, name, probe):
    service = _tool_for(services, name)
    namespaces = service.probe.confinement.get("processes") == "pid_namespace"
    if probe in NAMESPACES_ONLY and not namespaces:
        pytest.skip(f"{service.probe.network}: no mount or pid namespace, so this stays open (docs/sandbox.md)")
    if probe == "run_socket" and "run_socket" not in host:
        pytest.skip("no socket under /run (needs root)")
    if probe == "etc_shadow" and not (os.path.exists("/etc/shadow") and not os.stat("/etc/shadow").st_mode & 0o4):
        pytest.skip("no /etc/shadow that others may not read")
    uid = NOBODY if name == "nobody" else os.getuid()
    own = service.probe.confinement["uid"]
    if not namespaces and (probe, own) in {("tmp_secret", os.getuid()), ("signal_host", uid)}:
        pytest.skip("the program runs as the owner of the secret, and nothing hides it without namespaces")
    values = {key: value for key, value in host.items() if isinstance(value, str)}
    code = PRELUDE + PROBES[probe].format(**values, pid=host["sleepers"][uid].pid) + "\nprint('leaks', leaks)\n"
    result = service.run(code)
    assert (result.status, result.stdout) == ("ok", "leaks []\n"), (result.stdout, result.stderr[-1500:])
    assert os.listdir(host["drop"]) == []  # nothing left in the world-writable directory
    for listener in (host["socket_listener"], host.get("run_listener")):
        if listener is not None:
            with pytest.raises(BlockingIOError):
                listener.accept()  # nothing connected
    assert all(process.poll() is None for process in host["sleepers"].values())  # not killed
    assert_nothing_left(service)


def _hiding(path: str) -> str:
    """The first directory on the way to `path` that other users may not search (e.g. /root)."""
    parts = os.path.realpath(path).split("/")
    for depth in range(2, len(parts) + 1):
        place = "/".join(parts[:depth])
        if not os.stat(place).st_mode & 0o1:
            return place
    return path


@pytest.mark.skipif(fallback_python() is None, reason="needs root and an interpreter other users cannot read")
def test_an_interpreter_other_users_cannot_read(work_root):
    """As root the program runs as a uid of its own, which may not read an interpreter under /root (a pyenv).
    With namespaces it is shown the interpreter's directories and nothing else of the directory that hid them
    (not a capability that reads every file); without, the service refuses to start and says what to change."""
    hidden = _hiding(sys.base_prefix)
    shown = os.path.relpath(os.path.realpath(sys.base_prefix), hidden).split("/")[0]
    code = ("import decimal, os, sqlite3, subprocess, sys\n"  # modules the launcher has not imported
            "again = subprocess.run([sys.executable, '-I', '-c', 'import json; print(2)'], capture_output=True)\n"
            f"print(again.stdout.decode().strip(), sorted(os.listdir({hidden!r})))\n"
            "print(open('/etc/shadow').read())\n")
    with make_service(work_root, "own-python") as service:
        result = service.run(code)
    assert result.status == "error" and "PermissionError" in result.stderr, result
    assert result.stdout == f"2 {[shown]}\n"
    with pytest.raises(SandboxUnavailable, match=f"{re.escape(hidden)}.*python.*uid_base"):
        make_service(work_root, "own-python-seccomp", network_isolation=["seccomp"])


@pytest.mark.skipif(not IS_ROOT, reason="a user without root runs programs as itself")
def test_a_working_directory_other_users_cannot_reach(tmp_path):
    """tmp_dir below a directory only root may search: with namespaces the program reaches its working
    directory by its path all the same (through a tmpfs over that directory, holding just the way down);
    without, the service refuses to start and names the directory and the setting."""
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no /var/tmp (outside /tmp, which the namespaces hide anyway)")
    private = tempfile.mkdtemp(prefix="drmas-escape-", dir="/var/tmp")  # mode 0700
    try:
        root = Path(private) / "work"
        root.mkdir()
        with make_service(root, "namespaces") as service:
            result = service.run("import os\nopen(os.path.abspath('x'), 'w').write('x')\n"
                              f"print(os.listdir({private!r}))")
        assert (result.status, result.stdout) == ("ok", "['work']\n"), result
        with pytest.raises(SandboxUnavailable, match=rf"{re.escape(private)} \(above its working directory\).*tmp_dir"):
            make_service(root, "seccomp", network_isolation=["seccomp"], python=fallback_python())
    finally:
        shutil.rmtree(private)
