"""The confinement of one sandboxed program, applied by the operating system (not by reading the code).

Run by path as ``python -I confine.py SPEC_JSON`` in a fresh working directory (`drmas.tools.process` starts
it in a new session with a cleared environment and stdin on /dev/null). It imports nothing but the
standard library: `-I` ignores PYTHONPATH, so drmas itself may not be importable, and the program it runs
should find the interpreter as plain as `python -I` leaves it.

Three processes, so that whatever the program leaves behind dies with it:

* L (this script as started): a child subreaper (orphans of the program come back to it, not to init).
  It cuts the network off: a new network namespace (root), else a user namespace owning one (any user,
  where the kernel allows it), else a seccomp filter in U that refuses internet sockets
  (`seccomp_filter.py`); the two namespace ways also give new pid and mount namespaces, where the host
  turns read-only, the working directory and /tmp (and /dev/shm) become size-capped tmpfs mounts, and
  /run an empty one (`mounts.py`; both files are loaded by path from this one's directory). L waits for
  the program under the wall-clock limit, and copies its read-back files out.
* C, forked by L: in a pid namespace it is pid 1, a reaper that waits for U, in a mount namespace of its
  own with a /proc of that pid namespace; when C exits the kernel kills every process left in the
  namespace, including daemonised grandchildren. Without one, C *is* U and L kills U's process group and
  then each straggler that was reparented to it.
* U: drops root (to a uid of its own, which reads only what every user may, and to which RLIMIT_NPROC
  applies) and every capability, sets the resource limits and no_new_privs (and the seccomp filter when
  that is the network guard), then runs ``main.py`` in this interpreter (a fork, no exec).

C and U hold no descriptor but 0, 1, 2 and the status pipe: a fork inherits close-on-exec ones too.

Every process reports on the status pipe (fd given in the spec) as JSON lines: how it was confined,
the program's exit code or signal and CPU time, an uncaught MemoryError, a timeout, a setup failure.
The code can see that pipe too: the sandbox contains resources, it does not hide its own bookkeeping.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback
import types

if __package__:  # imported as drmas.tools.confine
    from drmas.tools import mounts, seccomp_filter
else:  # run by path with -I, where drmas may not be importable: the files next to this one, by these names
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # only while we import them
    import mounts
    import seccomp_filter

    del sys.path[0], sys.modules["mounts"], sys.modules["seccomp_filter"]  # the program's imports find its own

METHODS = ("netns", "userns", "seccomp")  # network isolation, in the spec's order of preference
SETUP_FAILED = 70  # exit code of U when it could not confine itself (the program never ran)

_CLONE_NEWNET, _CLONE_NEWPID, _CLONE_NEWUSER, _CLONE_NEWNS = 0x40000000, 0x20000000, 0x10000000, 0x00020000
_PR_SET_PDEATHSIG, _PR_SET_SECCOMP, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 1, 22, 36, 38
_CAPABILITY_VERSION_3 = 0x20080522
_SECCOMP_MODE_FILTER = 2

_libc = ctypes.CDLL(None, use_errno=True)


class _Stop(Exception):
    """Raised in L by SIGALRM (the wall-clock limit) or SIGTERM (the parent wants the program gone)."""


_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _prctl(option: int, arg: int = 0, arg3: int = 0) -> bool:
    return _libc.prctl(option, arg, arg3, 0, 0) == 0


def _unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


class _Status:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, **message) -> None:
        try:  # one line < PIPE_BUF: atomic even with three writers
            os.write(self.fd, (json.dumps(message) + "\n").encode())
        except OSError:
            pass  # the parent stopped reading: nothing to tell


# ---- L: network isolation --------------------------------------------------------------------------------


def _user_namespace() -> bool:
    """A user namespace owning new network, pid and mount namespaces, with our own uid/gid mapped to
    themselves (an unprivileged process may map exactly that, once setgroups is denied)."""
    uid, gid = os.getuid(), os.getgid()
    if not _unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWNS):
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    return True


def _isolate(spec: dict) -> tuple[str, bool]:
    """Cut the network off with the first method of the spec's list that works here; returns the method
    ('none' when none did) and whether the program gets pid and mount namespaces. Root skips the user
    namespace: in one it could not drop to the sandbox uid (unmapped there), and as root RLIMIT_NPROC would
    not hold."""
    for method in spec["network"]:
        if method == "netns" and _unshare(_CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWNS):
            return method, True
        if method == "userns" and os.getuid() != 0 and _user_namespace():
            return method, True
        if method == "seccomp" and os.uname().machine in seccomp_filter.SYSCALLS:
            return method, False
    return "none", False


def _processes_of(uid: int) -> int:
    """Processes whose real uid is `uid`: RLIMIT_NPROC counts them all, not just the program's."""
    count = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status") as handle:
                    count += any(line.startswith("Uid:") and int(line.split()[1]) == uid for line in handle)
            except (OSError, ValueError, IndexError):
                pass
    return count


# ---- U: the program's own process ------------------------------------------------------------------------


def _seccomp_no_network() -> bool:
    """Install `seccomp_filter.no_network` in this process (and every process it starts)."""

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    code = seccomp_filter.no_network(os.uname().machine)
    prog = _Program(len(code) // 8, code)
    return _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog))


def _drop_root(uid: int, gid: int) -> None:
    """Become `uid`, an unprivileged user of the sandbox's own: it may write only the working directory (and
    world-writable places), it reads only what every user may, and RLIMIT_NPROC, which root ignores, applies."""
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def _no_capabilities() -> None:
    """Drop every capability left. After setuid from root none are; but a process that made its user
    namespace holds all of them over its mounts, and could unmount the tmpfs mounts or turn the host writable
    again, and the program runs in this very process (no exec that would drop them)."""

    class _Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class _Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    if _libc.capset(ctypes.byref(_Header(_CAPABILITY_VERSION_3, 0)), (_Data * 2)()) != 0:
        raise OSError(ctypes.get_errno(), "dropping capabilities: " + os.strerror(ctypes.get_errno()))


def _limit(spec: dict, nproc: int | None) -> None:
    cpu = spec["cpu_s"]
    limits = {
        resource.RLIMIT_AS: spec["memory_bytes"],
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL a second later
        resource.RLIMIT_FSIZE: spec["file_bytes"],
        resource.RLIMIT_NOFILE: spec["open_files"],
        resource.RLIMIT_CORE: 0,  # a crash writes no core file into the working directory
    }
    if nproc is not None:
        limits[resource.RLIMIT_NPROC] = nproc
    for which, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        resource.setrlimit(which, (soft, hard))


def _program(spec: dict, status: _Status, nproc: int | None) -> None:
    """U: confine this process, then run main.py as __main__ like `python -I main.py` would; never returns."""
    for signum in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.setpgid(0, 0)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if spec["uid"] is not None and os.getuid() == 0:
            _drop_root(spec["uid"], spec["gid"])
        _no_capabilities()
        _limit(spec, nproc)
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)  # also a seccomp filter's precondition for a process without root
        if spec["seccomp"] and not _seccomp_no_network():
            raise OSError(ctypes.get_errno(), "seccomp filter refused: " + os.strerror(ctypes.get_errno()))
    except (OSError, ValueError) as exc:
        status.send(setup_error=f"confining the program failed: {exc}")
        os._exit(SETUP_FAILED)
    sys.argv = [spec["main"]]
    sys.path[0:0] = [os.getcwd()]  # the program may import the request's other files
    module = types.ModuleType("__main__")
    module.__file__ = spec["main"]
    sys.modules["__main__"] = module
    code = 0
    try:  # opened by its relative name: the working directory's parents need not be searchable by the uid
        with open(spec["main"], "rb") as handle:
            source = handle.read()
        exec(compile(source, spec["main"], "exec"), module.__dict__)
    except SystemExit as exc:
        code = exc.code
    except BaseException as exc:  # the traceback `python main.py` would print, and the exception's name
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != spec["main"]:
            tb = tb.tb_next  # from the program's own frames on, not this file's
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        status.send(uncaught=type(exc).__name__)
        code = 1
    sys.exit(code)  # the interpreter's own exit: atexit handlers, non-daemon threads, flushed streams


# ---- waiting and killing ---------------------------------------------------------------------------------


def _usage() -> dict:
    """CPU time and peak memory of every process reaped so far (and of what they reaped)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 4), "max_rss_kb": usage.ru_maxrss}


def _wait(pid: int, status: _Status) -> None:
    """Reap children until `pid` exits (a reaper also collects the orphans given to it), then report how it
    ended."""
    while True:
        reaped, code = os.waitpid(-1, 0)
        if reaped == pid:
            break
    ended = {"signal": os.WTERMSIG(code)} if os.WIFSIGNALED(code) else {"exit": os.WEXITSTATUS(code)}
    status.send(**ended, **_usage())


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children") as handle:
            return [int(p) for p in handle.read().split()]
    except OSError:
        pass
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as handle:
                    if int(handle.read().rsplit(")", 1)[1].split()[1]) == me:
                        found.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _sweep(deadline_s: float = 5.0) -> int:
    """Kill every child of this subreaper until none is left: a killed child's own children are reparented
    here and killed in the next pass. Returns how many were killed."""
    killed, stop = 0, time.monotonic() + deadline_s
    while time.monotonic() < stop:
        children = _children()
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return killed
        time.sleep(0.002)
    return killed


def _raise_stop(signum, frame) -> None:
    raise _Stop("timeout" if signum == signal.SIGALRM else "terminated")


def _reaper(spec: dict, status: _Status, nproc: int | None) -> None:
    """C as pid 1 of the program's pid namespace: run the program as pid 2 (pid 1 ignores signals it has no
    handler for, which would change how the program behaves), wait for it, leave; never returns."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    for signum in (signal.SIGTERM, signal.SIGALRM):
        signal.signal(signum, signal.SIG_DFL)
    try:
        status.send(proc=mounts.private_proc())
    except OSError as exc:
        status.send(setup_error=f"hiding the host's processes failed: {exc}")
        os._exit(SETUP_FAILED)
    program = os.fork()
    if program == 0:
        _program(spec, status, nproc)
    _wait(program, status)
    os._exit(0)  # the kernel now kills whatever the program left in the namespace


def _close_fds(keep: int) -> None:
    """In C or U: close every descriptor but 0, 1, 2 and `keep` (the status pipe). A fork inherits them all,
    close-on-exec or not, and the program runs without an exec: L's handle of the host's working directory
    (`mounts.private_disk`) would let it write past the tmpfs, and reach the rest of that filesystem."""
    try:  # the highest open one (a loop up to RLIMIT_NOFILE where the kernel lacks close_range is slow)
        top = max(map(int, os.listdir("/proc/self/fd"))) + 1
    except (OSError, ValueError):
        top = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    os.closerange(3, keep)
    os.closerange(keep + 1, top)


def _setup_failed(status: _Status, text: str) -> None:
    status.send(setup_error=text)
    sys.exit(SETUP_FAILED)


def _kill(pid: int, group: bool) -> None:
    for kill, target in ((os.killpg, pid), (os.kill, pid)) if group else ((os.kill, pid),):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> None:
    spec = json.loads(argv[1])
    status = _Status(spec["status_fd"])
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGALRM, _raise_stop)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # our parent died: still kill the program
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    uid = os.getuid() if spec["uid"] is None else spec["uid"]
    # counted before a user namespace, where every unmapped uid reads as the overflow uid (65534, "nobody")
    running = _processes_of(uid) if uid != 0 else 0
    method, pid_namespace = _isolate(spec)
    if method == "none" and spec["require_network_isolation"]:
        _setup_failed(status, "no way to cut the network off works here (tried: "
                              f"{', '.join(spec['network']) or 'none'}) and it is required")
    spec["seccomp"] = method == "seccomp"
    try:
        under = mounts.private_disk(spec, uid) if pid_namespace else None
        blocked = mounts.unreachable(uid) if uid != os.getuid() else None
    except OSError as exc:
        _setup_failed(status, f"hiding the host's files from the program failed: {exc}")
    if blocked is not None:  # not a capability to read every file instead: that read the host's secrets too
        place, remedy = blocked
        _setup_failed(status, f"the program's uid {uid} may not reach {place}"
                              f"{'' if pid_namespace else ', and without a mount namespace it cannot be shown it'}: "
                              f"{remedy}, or run programs as root (uid_base: null)")
    nproc = None
    if uid != 0:  # root is exempt from RLIMIT_NPROC; it counts every process of the uid (us included, and C)
        nproc = running + (1 if pid_namespace and uid == os.getuid() else 0) + spec["max_processes"]
    status.send(network=method, processes="pid_namespace" if pid_namespace else "subreaper",
                disk="tmpfs" if under is not None else "host", read_only_host=spec.get("read_only", False),
                uid=uid, process_limit=nproc is not None, **({} if pid_namespace else {"proc": "host"}))
    child = None
    signal.setitimer(signal.ITIMER_REAL, spec["timeout_s"])
    try:
        child = os.fork()
        if child == 0:
            _close_fds(status.fd)
            (_reaper if pid_namespace else _program)(spec, status, nproc)
        if pid_namespace:
            os.waitpid(child, 0)
        else:
            _wait(child, status)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except _Stop as stop:
        signal.setitimer(signal.ITIMER_REAL, 0)
        status.send(stopped=str(stop))
        if child is not None:  # pid 1 of a namespace takes everything in it along; else the program's group
            _kill(child, group=not pid_namespace)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # from here on the program dies anyway: finish the sweep
    if not pid_namespace and child is not None:
        _kill(child, group=True)  # the program's background processes in its own group
    status.send(swept=_sweep(), **_usage())  # the usage now includes a killed program and its stragglers
    if under is not None:
        mounts.copy_out(spec["read_back"], under, spec["file_bytes"])


if __name__ == "__main__":
    main(sys.argv)
