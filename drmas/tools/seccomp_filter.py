"""The seccomp filter of a sandboxed program that runs without namespaces (`drmas/tools/confine.py` installs it).

A BPF program, built here as bytes: socket() for any family but AF_UNIX fails (EPERM), and so do
io_uring_setup (its own way to make sockets), ptrace, and kill(-1), which would signal every process of the
user; so does every call through a foreign syscall ABI. Standard library only, like confine.py, which loads
this file by path when it runs as ``python -I confine.py``.
"""

from __future__ import annotations

import struct
from typing import Optional

# audit arch, the syscalls the filter looks at, and where a foreign ABI's numbers start (x32 calls on x86_64
# carry bit 30; they and i386 calls are refused wholesale, as they would bypass the numbers)
SYSCALLS = {
    "x86_64": (0xC000003E, {"socket": 41, "kill": 62, "ptrace": 101, "io_uring_setup": 425}, 0x40000000),
    "aarch64": (0xC00000B7, {"socket": 198, "kill": 129, "ptrace": 117, "io_uring_setup": 425}, None),
}


def no_network(machine: str) -> Optional[bytes]:
    """The filter's instructions (struct sock_filter, 8 bytes each) for `machine` (os.uname().machine); None
    where the syscall numbers are not known here."""
    if machine not in SYSCALLS:
        return None
    arch, nr, foreign = SYSCALLS[machine]
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    arg0 = 16  # offsets in struct seccomp_data: nr 0, arch 4, args[0] (its low word on little-endian) 16
    program = [("op", ld, 4), ("jump", jeq, arch, None, "deny"), ("op", ld, 0)]
    if foreign is not None:
        program.append(("jump", jge, foreign, "deny", None))
    program += [
        ("jump", jeq, nr["socket"], "socket", None),
        ("jump", jeq, nr["kill"], "kill", None),
        ("jump", jeq, nr["io_uring_setup"], "deny", None),
        ("jump", jeq, nr["ptrace"], "deny", "allow"),
        ("label", "socket"), ("op", ld, arg0), ("jump", jeq, 1, "allow", "deny"),  # AF_UNIX
        ("label", "kill"), ("op", ld, arg0), ("jump", jeq, 0xFFFFFFFF, "deny", "allow"),  # pid -1
        ("label", "allow"), ("op", ret, allow),
        ("label", "deny"), ("op", ret, deny),
    ]
    labels, index = {}, 0
    for item in program:
        if item[0] == "label":
            labels[item[1]] = index
        else:
            index += 1
    code, index = b"", 0
    for item in program:
        if item[0] == "label":
            continue
        index += 1
        if item[0] == "op":
            code += struct.pack("HBBI", item[1], 0, 0, item[2])
        else:  # a jump's offsets count instructions after the next one; None = fall through
            _, op, k, yes, no = item
            offset = [0 if t is None else labels[t] - index for t in (yes, no)]
            code += struct.pack("HBBI", op, offset[0], offset[1], k)
    return code
