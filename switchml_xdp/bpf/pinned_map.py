"""Open BPF maps pinned in bpffs and read/write them, from any process.

Values are ctypes structures (the layout of xdp/swml_maps.h). No bcc needed:
the calls are libbpf's.
"""
from __future__ import annotations

import ctypes as ct
import errno
import functools
import os

from . import libbpf
from .errors import PinnedMapError

BPF_ANY = 0


@functools.cache
def possible_cpus() -> int:
    """How many CPUs the kernel may bring up: the row count of a per-CPU map value."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def map_value_size(lib, fd: int) -> int:
    """value_size of the map behind `fd` (struct bpf_map_info: type, id, key_size, value_size)."""
    info = (ct.c_uint32 * 4)()
    size = ct.c_uint32(ct.sizeof(info))
    err = lib.bpf_obj_get_info_by_fd(fd, info, ct.byref(size))
    if err < 0:
        raise PinnedMapError(-err, f"cannot read the map's info: {os.strerror(-err)}")
    return info[3]


class PinnedMap:
    """A map pinned at `path`, keyed by u32 (or by `key`, a ctypes structure:
    a hash map's), holding `value_type`.

    For a per-CPU map (`percpu=True`) lookups return one value per possible CPU,
    each slot rounded up to 8 bytes as the kernel lays them out."""

    def __init__(self, path: str, value_type, percpu: bool = False, key=None):
        self.key_type = key
        self.path = path
        self.value_type = value_type
        self.percpu = percpu
        self._lib = libbpf.lib()
        fd = self._lib.bpf_obj_get(path.encode())
        if fd < 0:
            raise PinnedMapError(-fd, f"cannot open pinned map {path}: {os.strerror(-fd)}")
        self.fd = fd
        # A map pinned by another version of the program may hold larger
        # values: reading one into our smaller buffer would overwrite memory.
        size = map_value_size(self._lib, fd)
        if size != ct.sizeof(value_type):
            self.close()
            raise PinnedMapError(errno.EINVAL, f"pinned map {path} holds {size}-byte values, not the "
                                 f"{ct.sizeof(value_type)} bytes this version of switchml-xdp "
                                 f"reads (another version made it)")
        if percpu:
            self._stride = (ct.sizeof(value_type) + 7) // 8 * 8
            self._buf_type = ct.c_uint8 * (self._stride * possible_cpus())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _key(self, key):
        return key if self.key_type is not None else ct.c_uint32(key)

    def lookup(self, key: int):
        k = self._key(key)
        buf = self._buf_type() if self.percpu else self.value_type()
        err = self._lib.bpf_map_lookup_elem(self.fd, ct.byref(k), ct.byref(buf))
        if err < 0:
            raise PinnedMapError(-err, f"lookup {key} in {self.path}: {os.strerror(-err)}")
        if not self.percpu:
            return buf
        raw = bytes(buf)
        return [self.value_type.from_buffer_copy(raw, i * self._stride)
                for i in range(possible_cpus())]

    def update(self, key: int, value) -> None:
        if self.percpu:
            raise PinnedMapError(0, "per-CPU maps are written by the data plane only (zero() resets a row)")
        self._update(key, value)

    def zero(self, key: int) -> None:
        """Reset row `key` (on every CPU, for a per-CPU map)."""
        self._update(key, self._buf_type() if self.percpu else self.value_type())

    def delete(self, key) -> bool:
        """Remove a hash map's entry: False if there was none."""
        err = self._lib.bpf_map_delete_elem(self.fd, ct.byref(self._key(key)))
        if err == -errno.ENOENT:
            return False
        if err < 0:
            raise PinnedMapError(-err, f"delete {key} in {self.path}: {os.strerror(-err)}")
        return True

    def _update(self, key: int, value) -> None:
        k = self._key(key)
        err = self._lib.bpf_map_update_elem(self.fd, ct.byref(k), ct.byref(value), BPF_ANY)
        if err < 0:
            raise PinnedMapError(-err, f"update {key} in {self.path}: {os.strerror(-err)}")
