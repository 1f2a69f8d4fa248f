"""A file this process cannot read, also when the tests run as root.

root reads a file of mode 000 anyway (capabilities CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so a test of
what a user without read permission sees would pass for the wrong reason there. `unreadable_file` drops
those two capabilities from this thread's effective set while it is active (they stay permitted, and come
back on exit), so `open()` raises the PermissionError a user gets.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from typing import Iterator

_CAP_VERSION_3 = 0x20080522
_DAC_CAPS = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _capabilities(libc, data=None):
    header = _Header(_CAP_VERSION_3, 0)
    if data is None:
        data = (_Data * 2)()
        if libc.capget(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capget")
        return data
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")
    return data


@contextlib.contextmanager
def unreadable_file(path: Path) -> Iterator[Path]:
    """`path` (written by the caller) with mode 000, unreadable to this process while the context lasts."""
    path.chmod(0)
    if os.geteuid() != 0:
        yield path
        return
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    saved = _capabilities(libc)
    dropped = (_Data * 2)()
    ctypes.memmove(dropped, saved, ctypes.sizeof(dropped))
    for cap in _DAC_CAPS:
        dropped[0].effective &= ~(1 << cap)
    _capabilities(libc, dropped)
    try:
        yield path
    finally:
        _capabilities(libc, saved)
