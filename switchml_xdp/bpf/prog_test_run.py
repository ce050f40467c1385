"""Run a loaded program once on a buffer, without any interface or traffic:
the kernel's BPF_PROG_TEST_RUN (bcc's Python has no binding for it; libbpf does).

For an XDP program the buffer is a whole frame from its Ethernet header on
(at least 14 bytes); the program sees it as if received on loopback's queue 0,
and what it wrote into the frame comes back, whatever it returned. Nothing is
sent or redirected: XDP_TX and XDP_REDIRECT are only return values here.
"""
from __future__ import annotations

import ctypes as ct
import os

from . import libbpf
from .errors import BpfError

# Room for a program that grows the frame (bpf_xdp_adjust_head/tail) beyond its input.
_GROWTH = 4096


def prog_test_run(prog_fd: int, data: bytes, repeat: int = 1) -> tuple[int, bytes, int]:
    """Run program `prog_fd` on `data` (`repeat` times, each on a fresh copy).
    Returns (the program's return value, the data as the program left it,
    mean nanoseconds a run). BpfError when the kernel refuses the run (a frame
    shorter than an Ethernet header, a program type without test runs, no
    CAP_BPF)."""
    data_in = ct.create_string_buffer(bytes(data), len(data))
    data_out = ct.create_string_buffer(len(data) + _GROWTH)
    o = libbpf.opts(libbpf.ProgTestRunOpts, data_in=ct.addressof(data_in),
                    data_size_in=len(data), data_out=ct.addressof(data_out),
                    data_size_out=len(data_out), repeat=repeat)
    err = libbpf.lib().bpf_prog_test_run_opts(prog_fd, ct.byref(o))
    if err < 0:
        raise BpfError(f"cannot test-run BPF program fd {prog_fd} on {len(data)} bytes: "
                       f"{os.strerror(-err)}")
    return o.retval, data_out.raw[:o.data_size_out], o.duration
