"""What a sandboxed program sees of the host's files and processes: the mount-namespace work of
`drmas/tools/confine.py` (which loads this file by path; standard library only, like it).

In the mount namespace of L (the launcher, `private_disk`), for the two namespace ways:

* every mount of the host read-only (mount_setattr, Linux 5.12+): the program writes only the tmpfs
  mounts below, whatever its uid may write on the host;
* the working directory a tmpfs of `disk_bytes` holding the request's files, /tmp another (with /dev/shm
  bound to it): the disk cap, and none of the host's scratch files (checkpoints, keys, sockets);
* /run an empty tmpfs: the host's daemons listen there, and a socket that anyone may connect to stays
  connectable on a read-only mount;
* the working directory and the interpreter at their own paths (`_show`), so the program's uid reaches
  them where the host would not let it: below /tmp, or below a directory it may not search (a pyenv
  under /root, mode 0700), which a tmpfs then covers, holding only the way down. A capability to read
  every file (the old way) showed the host's secrets too; where the interpreter cannot be shown like this,
  the launcher refuses to run the program (`unreachable`) rather than keep one.

In C's own mount namespace (`private_proc`): /proc of the program's pid namespace, without the host's
processes. The seccomp fallback has no mount namespace: the program sees the host's files and processes as
its uid may, and the launcher only checks that this uid can reach the interpreter and the working directory.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

_CLONE_NEWNS = 0x00020000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
# mount_setattr, open_tree and move_mount have the same numbers on x86_64 and aarch64
_MOUNT_SETATTR, _AT_RECURSIVE, _MOUNT_ATTR_RDONLY, _OPEN_TREE, _OPEN_TREE_CLONE = 442, 0x8000, 0x1, 428, 0x1
_MOVE_MOUNT, _MOVE_MOUNT_F_EMPTY_PATH = 429, 0x4
_AT_FDCWD = -100
_HIDDEN = ("/tmp", "/run")  # the host's scratch space and its daemons' sockets: empty tmpfs mounts instead

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = (lambda text: None if text is None else text.encode())
    if _libc.mount(encode(source), target.encode(), encode(fstype), flags, encode(data)) != 0:
        raise OSError(ctypes.get_errno(), f"mount on {target}: {os.strerror(ctypes.get_errno())}")


def private_disk(spec: dict, uid: int) -> int | None:
    """L, in its own mount namespace: the host read-only, the working directory and /tmp capped tmpfs mounts,
    /run hidden, the working directory and the interpreter shown at their paths (see the module's docstring).
    Returns a descriptor of the directory underneath (where the read-back files go at the end; only L keeps
    it: C and U close it, as it would write past the tmpfs), or None where that is refused (the program then
    writes to the disk, each file capped by RLIMIT_FSIZE). Raises OSError where something cannot be hidden."""
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
    def unreached(path: str) -> bool:  # by the uid, by its path, once /tmp and /run are hidden
        return any(path.startswith(place + "/") for place in _HIDDEN) or _blocked(path, uid) is not None

    # read-only copies of those, taken before anything is hidden (only those: a copy closed unused costs a
    # wait for the kernel to dissolve it)
    trees = {path: _clone(path) for path in _python_dirs() if unreached(path)}
    if unreached(cwd):
        trees[cwd] = _clone(".")
    covers = []
    for place in filter(os.path.isdir, _HIDDEN):
        if place == "/tmp":
            _mount("tmpfs", "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"{size},mode=1777")
            if os.path.isdir("/dev/shm"):
                _mount("/tmp", "/dev/shm", None, _MS_BIND)
        elif not os.path.islink(place):
            _mount("tmpfs", place, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
            covers.append(place)
    covers += _show(trees, uid)
    for place in covers:  # the mount itself, not what was moved onto it (the working directory stays writable)
        _read_only(place, recursive=False)
    for name, data in files.items():
        with open(name, "wb") as handle:
            handle.write(data)
        os.chown(name, uid, uid)
    return under


def _clone(path: str) -> int:
    """A detached copy of the mounts at `path` and below (-1 where open_tree is missing, before Linux 5.2)."""
    return _libc.syscall(_OPEN_TREE, _AT_FDCWD, path.encode(), _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC)


def _python_dirs() -> list[str]:
    """The interpreter's directories (its installation, a virtual environment's, its executable's, the import
    path), none inside another."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, *sys.path]
    found = {os.path.realpath(path) for path in paths + [os.path.dirname(os.path.realpath(sys.executable or "/"))]}
    found = set(filter(os.path.isdir, found))
    return sorted(path for path in found if not any(path.startswith(other + "/") for other in found))


def _show(trees: dict[str, int], uid: int) -> list[str]:
    """Put each copied directory back at its path where the program's uid could not reach it there: under a
    hidden place (the working directory under /tmp), or below a directory it may not search, which gets a
    tmpfs (mode 0755) holding just the paths down to the copies. Returns the tmpfs mounts made."""
    covers = []
    for path, tree in sorted(trees.items()):
        if tree < 0:
            continue  # no open_tree: `unreachable` says what the uid may not reach
        blocked = _blocked(path, uid)
        if blocked is not None:
            if blocked == "/":
                raise OSError(f"/ is not searchable by uid {uid}")
            _mount("tmpfs", blocked, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=64k,mode=0755")
            covers.append(blocked)
        os.makedirs(path, mode=0o755, exist_ok=True)
        moved = _libc.syscall(_MOVE_MOUNT, tree, b"", _AT_FDCWD, path.encode(), _MOVE_MOUNT_F_EMPTY_PATH)
        os.close(tree)
        if moved != 0:
            raise OSError(ctypes.get_errno(), f"move_mount to {path}: {os.strerror(ctypes.get_errno())}")
    return covers


def _parents(path: str) -> list[str]:
    """The directories above `path`, from / down."""
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:depth]) for depth in range(len(parts))]


def _blocked(path: str, uid: int) -> str | None:
    """The first directory above `path` that `uid` may not search (None where what is missing comes first:
    `_show` makes it, searchable)."""
    for parent in _parents(path):
        if not os.path.isdir(parent):
            return None
        if not _searchable(parent, uid):
            return parent
    return None


def _searchable(path: str, uid: int, bits: int = 0o1) -> bool:
    """Whether `uid` may search (`bits` 0o5: also list) `path`: as any other user where it is not ours (the
    sandbox's uid owns nothing and has no groups), else by access()."""
    if uid == os.getuid():
        return os.access(path, os.X_OK | (os.R_OK if bits & 0o4 else 0))
    return os.stat(path).st_mode & bits == bits


def unreachable(uid: int) -> tuple[str, str] | None:
    """Where `uid` may not read, or search on the way, what the program reaches by its path (a directory of the
    interpreter's import path, the working directory), and what to do about it; None where it may."""
    for path in filter(os.path.isdir, map(os.path.realpath, [*_python_dirs(), *sys.path])):
        for place in [*_parents(path), path]:
            if not _searchable(place, uid, 0o5 if place == path else 0o1):
                return (f"{place} (on the interpreter's import path)",
                        "give the sandbox an interpreter every user may read (its `python` setting, e.g. "
                        "/usr/bin/python3), make that path readable by all (chmod o+rx, o+x on its parents)")
    blocked = _blocked(os.getcwd(), uid)
    if blocked is not None:
        return f"{blocked} (above its working directory)", "set `tmp_dir` to a directory every user may search"
    return None


def _read_only(path: str, recursive: bool = True) -> bool:
    """Every mount under `path` (or just the one at `path`) read-only in our mount namespace; false where the
    kernel lacks mount_setattr (before Linux 5.12)."""

    class _Attr(ctypes.Structure):
        _fields_ = [("set", ctypes.c_uint64), ("clear", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                    ("userns_fd", ctypes.c_uint64)]

    attr = _Attr(_MOUNT_ATTR_RDONLY, 0, 0, 0)
    return _libc.syscall(_MOUNT_SETATTR, _AT_FDCWD, path.encode(), _AT_RECURSIVE if recursive else 0,
                         ctypes.byref(attr), ctypes.sizeof(attr)) == 0


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


def private_proc() -> str:
    """C, in a mount namespace of its own (L's /proc stays the host's): /proc of the program's pid namespace,
    read-only as the rest, so the host's processes (their command lines, a same-user trainer's environment)
    are not in it; 'private'. Where a fresh procfs is refused (a user namespace under a /proc with masked
    parts), an empty /proc: 'hidden'."""
    if _libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare: " + os.strerror(ctypes.get_errno()))
    flags = _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    try:
        _mount("proc", "/proc", "proc", flags)
        return "private"
    except OSError:
        _mount("tmpfs", "/proc", "tmpfs", flags, "size=4k,mode=0555")
        return "hidden"
