"""ctypes bindings to the few libbpf calls the door makes (libbpf.so.1).

libbpf is what bcc itself links against, so it is there wherever bcc is; the
calls below need no compiled program and no bcc import, which keeps `status`,
`down` and pin handling free of clang. Every call returns a negative errno on
failure (libbpf 1.x), never a message on stderr.
"""
from __future__ import annotations

import ctypes as ct
import functools
import os

from .errors import BpfError

# include/uapi/linux/if_link.h and linux/bpf.h (kernel ABI, append-only).
XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1        # generic XDP
XDP_FLAGS_DRV_MODE = 1 << 2        # native XDP
BPF_XDP = 37                       # enum bpf_attach_type
ATTACHED_MODES = {1: "native", 2: "generic", 3: "offload", 4: "multi"}   # XDP_ATTACHED_*
PROG_INFO_NAME = 64                # offsetof(struct bpf_prog_info, name), char[16]
PROG_INFO_RUN_TIME_NS = 192        # offsetof(struct bpf_prog_info, run_time_ns)
PROG_INFO_RUN_CNT = 200            # offsetof(struct bpf_prog_info, run_cnt)
PROG_INFO_LEN = 208


class XdpAttachOpts(ct.Structure):
    _fields_ = [("sz", ct.c_size_t), ("old_prog_fd", ct.c_int)]


class XdpQueryOpts(ct.Structure):
    _fields_ = [("sz", ct.c_size_t), ("prog_id", ct.c_uint32), ("drv_prog_id", ct.c_uint32),
                ("hw_prog_id", ct.c_uint32), ("skb_prog_id", ct.c_uint32),
                ("attach_mode", ct.c_uint8)]


class LinkCreateOpts(ct.Structure):
    _fields_ = [("sz", ct.c_size_t), ("flags", ct.c_uint32)]


class ProgTestRunOpts(ct.Structure):
    """struct bpf_test_run_opts (bpf.h); zeroed tail fields mean "not used"."""
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("ctx_in", ct.c_void_p), ("ctx_out", ct.c_void_p),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


def opts(struct_type, **fields):
    """A libbpf options struct with its size field set (libbpf reads no further)."""
    return struct_type(sz=ct.sizeof(struct_type), **fields)


@functools.cache
def lib() -> ct.CDLL:
    try:
        so = ct.CDLL("libbpf.so.1", use_errno=True)
    except OSError as e:
        raise BpfError(f"libbpf is not installed ({e}): Debian package libbpf1") from None
    sigs = {
        "bpf_xdp_attach": [ct.c_int, ct.c_int, ct.c_uint32, ct.c_void_p],
        "bpf_xdp_detach": [ct.c_int, ct.c_uint32, ct.c_void_p],
        "bpf_xdp_query": [ct.c_int, ct.c_int, ct.c_void_p],
        "bpf_link_create": [ct.c_int, ct.c_int, ct.c_int, ct.c_void_p],
        "bpf_prog_get_fd_by_id": [ct.c_uint32],
        "bpf_obj_get_info_by_fd": [ct.c_int, ct.c_void_p, ct.c_void_p],
        "bpf_obj_get": [ct.c_char_p],
        "bpf_map_lookup_elem": [ct.c_int, ct.c_void_p, ct.c_void_p],
        "bpf_map_update_elem": [ct.c_int, ct.c_void_p, ct.c_void_p, ct.c_uint64],
        "bpf_map_delete_elem": [ct.c_int, ct.c_void_p],
        "bpf_prog_test_run_opts": [ct.c_int, ct.c_void_p],
        "bpf_enable_stats": [ct.c_int],
    }
    for name, argtypes in sigs.items():
        fn = getattr(so, name)
        fn.argtypes, fn.restype = argtypes, ct.c_int
    return so


def check(ret: int) -> int:
    """`ret` if it is not an error, else OSError with its errno."""
    if ret < 0:
        raise OSError(-ret, os.strerror(-ret))
    return ret
