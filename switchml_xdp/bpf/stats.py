"""Kernel run-time statistics of a loaded program (BPF_ENABLE_STATS)."""
from __future__ import annotations

import contextlib
import ctypes as ct
import os
from pathlib import Path

from . import libbpf
from .errors import BpfError

_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
BPF_STATS_RUN_TIME = 0


@contextlib.contextmanager
def stats_enabled():
    """The kernel's run-time statistics on for the duration (two clock reads
    a run). Through BPF_ENABLE_STATS: they stay on while any user's file
    descriptor is open, so overlapping users (two benches) never turn them
    off under each other, as saving and restoring the sysctl did (and left
    it on). Kernels before 5.8: the sysctl."""
    fd = libbpf.lib().bpf_enable_stats(BPF_STATS_RUN_TIME)
    if fd >= 0:
        try:
            yield
        finally:
            os.close(fd)
        return
    old = _SYSCTL.read_text().strip()
    _SYSCTL.write_text("1")
    try:
        yield
    finally:
        _SYSCTL.write_text(old)


def _prog_info(prog_id: int):
    lib = libbpf.lib()
    fd = lib.bpf_prog_get_fd_by_id(prog_id)
    if fd < 0:
        raise BpfError(f"no BPF program with id {prog_id}: {os.strerror(-fd)}")
    try:
        info = (ct.c_uint8 * libbpf.PROG_INFO_LEN)()
        size = ct.c_uint32(libbpf.PROG_INFO_LEN)
        err = lib.bpf_obj_get_info_by_fd(fd, info, ct.byref(size))
        if err < 0:
            raise BpfError(f"cannot read program {prog_id}'s info: {os.strerror(-err)}")
    finally:
        os.close(fd)
    return info


def prog_name(prog_id: int) -> str:
    """The name program `prog_id` was loaded with (its function's, cut to 15 bytes)."""
    info = _prog_info(prog_id)
    return bytes(info[libbpf.PROG_INFO_NAME:libbpf.PROG_INFO_NAME + 16]).split(b"\0")[0].decode()


def prog_stats(prog_id: int) -> dict:
    """{"run_cnt", "run_time_ns"} of program `prog_id` (zeros while stats are off)."""
    info = _prog_info(prog_id)
    u64 = ct.c_uint64.from_buffer
    return {"run_cnt": u64(info, libbpf.PROG_INFO_RUN_CNT).value,
            "run_time_ns": u64(info, libbpf.PROG_INFO_RUN_TIME_NS).value}
