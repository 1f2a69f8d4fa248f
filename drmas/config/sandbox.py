"""`sandbox`: limits of the code-execution service (`drmas.tools.sandbox.SandboxService`) that runs model-written
Python.

Not a top-level section of DrmasConfig: the service belongs to the orchestra that uses it (a code system's
settings embed a `SandboxConfig`), so each system says where its sandbox settings live, and `where` names
that place in every error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from drmas.config.fields import Section
from drmas.config.fields import help_field as _f

# ways to cut the program off the network, tried in the listed order (drmas/tools/confine.py implements them)
NETWORK_ISOLATION = ("netns", "userns", "seccomp")


@dataclass
class SandboxConfig(Section):
    workers: int = _f(
        4, "Programs run at once by one sandbox service: a batch's requests run in parallel up to this many, the "
        "rest wait for a free worker. Each worker is one process tree at a time.")
    timeout_s: float = _f(
        10.0, "Wall-clock limit of one program, from its start (the interpreter's ~0.1 s included); then the "
        "program and every process it started are killed: status 'timeout'.")
    cpu_s: int = _f(
        10, "CPU seconds of each process of the program (RLIMIT_CPU; SIGXCPU, then SIGKILL a second later): "
        "status 'timeout'. Whole seconds.")
    memory_mb: int = _f(
        1024, "Address space of each process of the program (RLIMIT_AS, MiB): a bigger allocation fails "
        "(MemoryError: status 'memory'). Virtual memory, so threads' stacks and mapped libraries count; "
        "Python itself needs ~30 MiB, importing numpy a few hundred.")
    max_processes: int = _f(
        16, "Processes the program may run at once, itself included (RLIMIT_NPROC of a uid of its own): a fork "
        "bomb gets EAGAIN. Not enforced when the program runs as root (`uid_base: null`).")
    max_file_mb: int = _f(16, "Largest file the program may write (RLIMIT_FSIZE, MiB); a longer write fails (EFBIG).")
    max_disk_mb: int = _f(
        64, "What the program may write (MiB), with namespaces: its working directory is a tmpfs of this size "
        "and /tmp (with /dev/shm) another, both in memory and gone with the program (ENOSPC beyond). With the "
        "seccomp fallback only each file is capped (max_file_mb), on the host's disk.")
    max_open_files: int = _f(64, "File descriptors of each process of the program (RLIMIT_NOFILE).")
    max_output_kb: int = _f(
        1024, "stdout and stderr together, KiB; a program that writes more is killed: status 'output_limit'.")
    tail_chars: int = _f(
        4000, "Characters kept of the end of stdout and of stderr each in a result (what an agent is shown).")
    network_isolation: list = _f(
        list(NETWORK_ISOLATION),
        "Ways to cut the program off the network, tried in this order: 'netns' (a new network namespace, "
        "needs root or CAP_SYS_ADMIN; also a pid namespace), 'userns' (a user namespace owning new network and "
        "pid namespaces, for a user without root where the kernel allows it), 'seccomp' (a filter that refuses "
        "every socket but AF_UNIX; x86_64 and aarch64). Each result says which one held ('none': none did).")
    require_network_isolation: bool = _f(
        True, "Refuse to run (an error when the service starts) where no method of `network_isolation` works; "
        "false: run such programs with the network and say so in each result and the log.")
    uid_base: Optional[int] = _f(
        2_147_000_000, "When drmas runs as root, worker N runs programs as uid uid_base + N (no account needed): "
        "it cannot write root's files nor read what only root may, and RLIMIT_NPROC, which root ignores, "
        "applies. null: programs run as root, without a process limit.")
    python: Optional[str] = _f(
        None, "Interpreter the programs run in, with -I (null: the one running drmas). As root without namespaces "
        "(the seccomp fallback) it must be one every user may read, e.g. /usr/bin/python3: the service refuses "
        "to start otherwise (with namespaces, one under /root is shown to the programs' uid).")
    tmp_dir: Optional[str] = _f(
        None, "Where each program's working directory is made and removed afterwards (null: the system's temp "
        "directory). As root without namespaces, every user must be able to search its parents.")

    def problems(self, where: str) -> list[str]:
        found = []
        for key, least in (("workers", 1), ("cpu_s", 1), ("memory_mb", 16), ("max_processes", 1), ("max_file_mb", 1),
                           ("max_disk_mb", 1), ("max_open_files", 8), ("max_output_kb", 1), ("tail_chars", 0)):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                found.append(f"{where}.{key}: must be an integer >= {least}, got {value!r}")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            found.append(f"{where}.timeout_s: must be a number > 0, got {self.timeout_s!r}")
        methods = list(self.network_isolation) if isinstance(self.network_isolation, (list, tuple)) else None
        if methods is None or any(m not in NETWORK_ISOLATION for m in methods) or len(set(methods)) != len(methods):
            found.append(f"{where}.network_isolation: must list distinct methods of {', '.join(NETWORK_ISOLATION)} "
                         f"(or be empty), got {self.network_isolation!r}")
        top = 2**32 - 2 - (self.workers if isinstance(self.workers, int) else 0)  # (uid_t)-1 means "no change"
        if self.uid_base is not None and (isinstance(self.uid_base, bool) or not isinstance(self.uid_base, int)
                                          or not 1 <= self.uid_base <= top):
            found.append(f"{where}.uid_base: must be null or an integer in 1..{top} (uid_base + workers is a uid), "
                         f"got {self.uid_base!r}")
        return found
