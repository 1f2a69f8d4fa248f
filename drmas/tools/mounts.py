"""What a sandboxed program sees of the host's files: the mount-namespace work of `drmas/tools/confine.py`
(which loads this file by path; standard library only, like it).
"""

from __future__ import annotations

import ctypes
import os
import stat

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
# mount_setattr and open_tree have the same numbers on x86_64 and aarch64
_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY, _OPEN_TREE, _OPEN_TREE_CLONE = 442, 0x8000, 0x1, 428, 0x1
_AT_FDCWD = -100

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = (lambda text: None if text is None else text.encode())
    if _libc.mount(encode(source), target.encode(), encode(fstype), flags, encode(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount on {target}: {os.strerror(ctypes.get_errno())}")


def private_disk(spec: dict, uid: int) -> int | None:
    """In our own mount namespace, make what the program may write memory of capped size that vanishes with
    the namespace: every mount read-only, then the working directory a tmpfs of `disk_bytes` holding the same
    files, and /tmp (with /dev/shm bound to it) another, in which the working directory's path is kept.
    Returns a descriptor of the directory underneath (where the read-back files go at the end), or None
    where that is refused (the program then writes to the disk, each file capped by RLIMIT_FSIZE)."""
    cwd = os.getcwd()  # paths are used relative to it: its parents need not be searchable by a user without root
    # a detached copy of the directory's mount (Linux 5.2+) stays writable when the others turn read-only
    tree = _libc.syscall(_OPEN_TREE, _AT_FDCWD, b".", _OPEN_TREE_CLONE | os.O_CLOEXEC)
    under = tree if tree >= 0 else os.open(".", os.O_RDONLY | os.O_DIRECTORY)
    files = {}
    for name in os.listdir("."):
        with open(os.open(name, os.O_RDONLY | os.O_NOFOLLOW), "rb") as handle:
            files[name] = handle.read()
    size = f"size={spec['disk_bytes']}"
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here shows outside
        spec["read_only"] = tree >= 0 and _read_only("/")
        _mount("tmpfs", ".", "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},mode=0700,uid={uid},gid={uid}")
    except OSError:
        os.close(under)
        return None
    os.chdir(os.path.join("..", os.path.basename(cwd)))  # into the new tmpfs ("." is still the one below)
    if os.path.isdir("/tmp"):
        _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},mode=1777")
        if not os.path.isdir(cwd):  # it was under /tmp: the same path again, in the new /tmp
            os.makedirs(cwd, mode=0o711)
            _mount("/proc/self/cwd", cwd, None, _MS_BIND)
        if os.path.isdir("/dev/shm"):
            _mount("/tmp", "/dev/shm", None, _MS_BIND)
    for name, data in files.items():
        with open(name, "wb") as handle:
            handle.write(data)
        os.chown(name, uid, uid)
    return under


def _read_only(path: str) -> bool:
    """Every mount under `path` read-only in our mount namespace, so the program writes only the tmpfs
    mounts made after this, whatever its uid may write on the host; false where the kernel lacks
    mount_setattr (before Linux 5.12)."""

    class _Attr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clear", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                    ("userns_fd", ctypes.c_uint64)]

    attr = _Attr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    return _libc.syscall(_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE, ctypes.byref(attr),
                         ctypes.sizeof(attr)) == 0


def copy_out(names: list[str], under: int, limit: int) -> None:
    """The read-back files the program left in the tmpfs, copied to the directory underneath for the parent
    (never through a symlink, at most `limit` bytes each)."""
    for name in names:
        try:
            source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        with open(source, "rb") as handle:
            if not stat.S_ISREG(os.fstat(source).st_mode):
                continue
            data = handle.read(limit)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with open(os.open(name, flags, 0o600, dir_fd=under), "wb") as out:
            out.write(data)
