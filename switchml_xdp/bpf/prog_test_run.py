"""Run a loaded program once on a buffer, without any interface or traffic:
the kernel's BPF_PROG_TEST_RUN (bcc's Python has no binding for it; libbpf does).

For an XDP program the buffer is a whole frame from its Ethernet header on
(at least 14 bytes); the program sees it as if received on loopback's queue 0
(or on the interface and queue `rx` names, in this thread's network
namespace), and what it wrote into the frame comes back, whatever it
returned. Nothing is sent or redirected: XDP_TX and XDP_REDIRECT are only
return values here.
"""
from __future__ import annotations

import ctypes as ct
import os

from . import libbpf
from .errors import BpfError

# Room for a program that grows the frame (bpf_xdp_adjust_head/tail) beyond its input.
_GROWTH = 4096


class XdpMd(ct.Structure):
    """struct xdp_md, the context an XDP test run may be given (bpf.h)."""
    _fields_ = [("data", ct.c_uint32), ("data_end", ct.c_uint32), ("data_meta", ct.c_uint32),
                ("ingress_ifindex", ct.c_uint32), ("rx_queue_index", ct.c_uint32),
                ("egress_ifindex", ct.c_uint32)]


def prog_test_run(prog_fd: int, data: bytes, repeat: int = 1,
                  rx: tuple[int, int] | None = None) -> tuple[int, bytes, int]:
    """Run program `prog_fd` on `data` (`repeat` times, each on a fresh copy);
    an XDP program with rx = (ifindex, queue): as received there (the
    interface must have that receive queue). Returns (the program's return
    value, the data as the program left it, mean nanoseconds a run).
    BpfError when the kernel refuses the run (a frame shorter than an
    Ethernet header, a program type without test runs, no such queue, no
    CAP_BPF)."""
    data_in = ct.create_string_buffer(bytes(data), len(data))
    data_out = ct.create_string_buffer(len(data) + _GROWTH)
    ctx = None if rx is None else XdpMd(data_end=len(data), ingress_ifindex=rx[0],
                                        rx_queue_index=rx[1])
    o = libbpf.opts(libbpf.ProgTestRunOpts, data_in=ct.addressof(data_in),
                    data_size_in=len(data), data_out=ct.addressof(data_out),
                    data_size_out=len(data_out), repeat=repeat,
                    ctx_in=None if ctx is None else ct.addressof(ctx),
                    ctx_size_in=0 if ctx is None else ct.sizeof(ctx))
    err = libbpf.lib().bpf_prog_test_run_opts(prog_fd, ct.byref(o))
    if err < 0:
        raise BpfError(f"cannot test-run BPF program fd {prog_fd} on {len(data)} bytes: "
                       f"{os.strerror(-err)}")
    return o.retval, data_out.raw[:o.data_size_out], o.duration
