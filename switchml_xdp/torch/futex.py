"""Sleep until a word of shared memory changes: Linux futex(2) through ctypes.

The shared-memory local group (shm_local.py) waits for another process's
word; polling with sleeps either burns a core or wakes up to a sleep's length
late (milliseconds, on a loaded host). A futex on a 32-bit word of a
MAP_SHARED mapping sleeps in the kernel until the writer's wake(), across
processes. Where it cannot be had (an architecture not listed, no libc),
`available` is False and wait() sleeps a fraction of a millisecond: the
caller's loop then polls, costing CPU instead of latency.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import platform
import time

# Little-endian machines only: the caller's word is the low half of an int64.
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98, "riscv64": 98,
              "ppc64le": 221}.get(platform.machine())
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1     # not _PRIVATE: the word is shared between processes
_WAKE_ALL = 0x7FFFFFFF
_POLL_S = 2e-4                      # without a futex: the caller polls this often


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _libc():
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        lib.syscall.restype = ctypes.c_long
        return lib
    except OSError:
        return None


_LIBC = _libc() if _SYS_FUTEX is not None else None
available = _LIBC is not None


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the 32-bit word at `address` holds `expected`, at most
    timeout_s; returns early on a wake(), a change, or a signal (without a
    futex: after _POLL_S at most, whatever the word)."""
    if not available:
        time.sleep(min(timeout_s, _POLL_S))
        return
    ts = _Timespec(int(timeout_s), int((timeout_s % 1) * 1e9))
    r = _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT,
                      ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(ts), None, 0)
    if r != 0 and ctypes.get_errno() not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
        raise OSError(ctypes.get_errno(), "futex wait failed")


def wake(address: int) -> None:
    """Wake every process sleeping on the word at `address`."""
    if available:
        _LIBC.syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, _WAKE_ALL, None, None, 0)
