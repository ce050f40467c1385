"""Open BPF maps pinned in bpffs and read/write them, from any process.

The switch pins its maps so that `swml-switch status`, `down` and a restarted
daemon find them without the program that created them. Values are ctypes
structures derived from xdp/swml_maps.h (switchml_xdp.cheaders).
"""
from __future__ import annotations

import ctypes as ct
import os

from bcc.libbcc import lib
from bcc.utils import get_possible_cpus

lib.bpf_obj_get.restype = ct.c_int
lib.bpf_obj_get.argtypes = [ct.c_char_p]

BPF_ANY = 0
_NCPUS = len(get_possible_cpus())


class PinnedMapError(OSError):
    pass


class PinnedMap:
    """An array map pinned at `path`, keyed by u32, holding `value_type`.

    For a per-CPU map (`percpu=True`) lookups return one value per possible CPU,
    each slot rounded up to 8 bytes as the kernel lays them out."""

    def __init__(self, path: str, value_type, percpu: bool = False):
        self.path = path
        self.value_type = value_type
        self.percpu = percpu
        fd = lib.bpf_obj_get(path.encode())
        if fd < 0:
            err = ct.get_errno()
            raise PinnedMapError(err, f"cannot open pinned map {path}: {os.strerror(err)}")
        self.fd = fd
        if percpu:
            stride = (ct.sizeof(value_type) + 7) // 8 * 8
            self._buf_type = ct.c_uint8 * (stride * _NCPUS)
            self._stride = stride

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def lookup(self, key: int):
        k = ct.c_uint32(key)
        buf = self._buf_type() if self.percpu else self.value_type()
        if lib.bpf_lookup_elem(self.fd, ct.byref(k), ct.byref(buf)) < 0:
            err = ct.get_errno()
            raise PinnedMapError(err, f"lookup {key} in {self.path}: {os.strerror(err)}")
        if not self.percpu:
            return buf
        return [self.value_type.from_buffer_copy(bytes(buf), i * self._stride) for i in range(_NCPUS)]

    def update(self, key: int, value) -> None:
        if self.percpu:
            raise PinnedMapError(0, "per-CPU maps are written by the data plane only")
        k = ct.c_uint32(key)
        if lib.bpf_update_elem(self.fd, ct.byref(k), ct.byref(value), BPF_ANY) < 0:
            err = ct.get_errno()
            raise PinnedMapError(err, f"update {key} in {self.path}: {os.strerror(err)}")
