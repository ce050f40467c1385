"""The shared-memory segment of one host's ranks: its name, its layout, its
life (the local reduce of CPU tensors through shared memory: docs/pytorch.md,
"The local reduce").

The leader creates the segment under a fresh random name in /dev/shm (so a
segment left by a crashed run never collides with a new one), the others map
it by that name, and the leader unlinks the name as soon as they all have:
from then on the memory lives only as long as a process maps it, and no
crash, of any rank, leaves anything in /dev/shm.

Layout (all offsets 64-byte aligned, so that no two ranks' words share a
cache line):

    [leader line]  consumed, result, failed_call, message length, geometry, bell
    [rank line] x R  posted, taken, the call's header (call, numel, dtype, op),
                   pid, bell
    [message]     the leader's error for a failed call (utf-8)
    [region] x R  each rank's contribution (the leader's: the result),
                  SLOTS slots of slot_bytes, used in turn

The words are int64, written by exactly one rank each (an aligned 8-byte
store, never torn) and read by the others: which rank writes which word is
in shm_local.py. A line's bell counts its writer's publications: a futex
word that the others sleep on (futex.py).
"""
from __future__ import annotations

import mmap
import os
import secrets
from dataclasses import dataclass

import numpy as np
import torch

from . import futex

SHM_DIR = "/dev/shm"
NAME_PREFIX = "swml-local-"
MAGIC = 0x53574D4C5348_0001       # "SWMLSH", version 1
SLOTS = 2                          # a rank fills one slot while the leader reduces the other
ALIGN = 64                         # bytes: a cache line
LINE = 2 * ALIGN                   # bytes of control words per writer
WORDS = LINE // 8
MESSAGE_BYTES = 4096
DEFAULT_REGION_BYTES = 4 << 20     # per rank; SwmlOptions.shm_bytes / SWML_SHM_BYTES

# Leader line (words)
CONSUMED, RESULT, FAILED_CALL, MESSAGE_LEN, MAGIC_W, N_RANKS, SLOT_BYTES, BELL = range(8)
# Rank lines (words)
POSTED, TAKEN, CALL, NUMEL, DTYPE, OP, PID, PID_NS = range(8)
RANK_BELL = 8



def _align(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Geometry:
    n_ranks: int
    slot_bytes: int

    @classmethod
    def for_region(cls, n_ranks: int, region_bytes: int) -> Geometry:
        slot = max(ALIGN, (region_bytes // SLOTS) // ALIGN * ALIGN)
        return cls(n_ranks, slot)

    @property
    def data_offset(self) -> int:
        return _align(LINE * (1 + self.n_ranks) + MESSAGE_BYTES, mmap.PAGESIZE)

    @property
    def region_bytes(self) -> int:
        return SLOTS * self.slot_bytes

    @property
    def total_bytes(self) -> int:
        return self.data_offset + self.n_ranks * self.region_bytes


class Segment:
    """One mapping of the segment, with int64 views of its control words and
    byte views of its regions' slots."""

    def __init__(self, fd: int, name: str, geometry: Geometry):
        self.name = name
        self.geometry = geometry
        try:
            self._map = mmap.mmap(fd, geometry.total_bytes, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        words = np.frombuffer(self._map, dtype=np.int64, count=WORDS * (1 + geometry.n_ranks))
        self.leader_line = words[:WORDS]
        self.rank_lines = [words[WORDS * (1 + r):WORDS * (2 + r)] for r in range(geometry.n_ranks)]
        self._message = np.frombuffer(self._map, dtype=np.uint8, count=MESSAGE_BYTES,
                                      offset=LINE * (1 + geometry.n_ranks))
        self._data = torch.frombuffer(self._map, dtype=torch.uint8, offset=geometry.data_offset,
                                      count=geometry.n_ranks * geometry.region_bytes)

    # -- creation -------------------------------------------------------------
    @classmethod
    def create(cls, geometry: Geometry) -> Segment:
        """A new segment under a name nobody has used (O_EXCL), owner-only."""
        while True:
            name = NAME_PREFIX + secrets.token_hex(8)
            try:
                fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                break
            except FileExistsError:
                continue
        try:
            # Reserve the pages now: a tmpfs too small for the segment fails
            # here (ENOSPC), where ftruncate would let a later write SIGBUS.
            os.posix_fallocate(fd, 0, geometry.total_bytes)
        except BaseException:
            os.close(fd)
            os.unlink(os.path.join(SHM_DIR, name))
            raise
        seg = cls(fd, name, geometry)
        line = seg.leader_line
        line[N_RANKS], line[SLOT_BYTES], line[FAILED_CALL] = geometry.n_ranks, geometry.slot_bytes, -1
        line[MAGIC_W] = MAGIC
        return seg

    @classmethod
    def attach(cls, name: str) -> Segment:
        """The leader's segment, with the leader's geometry (whatever this
        rank's own setting)."""
        if not name.startswith(NAME_PREFIX) or "/" in name:
            raise ValueError(f"not a swml segment name: {name!r}")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        try:
            head = np.frombuffer(os.pread(fd, LINE, 0), dtype=np.int64)
        except BaseException:
            os.close(fd)
            raise
        if int(head[MAGIC_W]) != MAGIC:
            os.close(fd)
            raise ValueError(f"{SHM_DIR}/{name} is not a swml segment of this version")
        return cls(fd, name, Geometry(int(head[N_RANKS]), int(head[SLOT_BYTES])))

    def unlink(self) -> None:
        """Remove the name (the mappings stay valid); idempotent."""
        try:
            os.unlink(os.path.join(SHM_DIR, self.name))
        except FileNotFoundError:
            pass

    # -- data -----------------------------------------------------------------
    def slot(self, rank: int, index: int, dtype: torch.dtype) -> torch.Tensor:
        """Slot `index % SLOTS` of `rank`'s region, as a 1-D tensor of dtype."""
        g = self.geometry
        start = rank * g.region_bytes + (index % SLOTS) * g.slot_bytes
        return self._data[start:start + g.slot_bytes].view(dtype)

    # -- bells: local rank 0 (the leader) rings its leader line's, the others their own
    def _bell(self, local_rank: int) -> tuple[np.ndarray, int]:
        if local_rank == 0:
            return self.leader_line, BELL
        return self.rank_lines[local_rank], RANK_BELL

    def bell(self, local_rank: int) -> int:
        line, w = self._bell(local_rank)
        return int(line[w])

    def ring(self, local_rank: int) -> None:
        """After this rank published a word: count it, and wake who sleeps on it."""
        line, w = self._bell(local_rank)
        line[w] = (int(line[w]) + 1) & 0x7FFFFFFF     # a futex compares 32 bits
        futex.wake(line.ctypes.data + 8 * w)

    def sleep_on(self, local_rank: int, seen: int, timeout_s: float) -> None:
        """Until `local_rank` rings after `seen` (= bell() read before the
        caller last checked its condition), at most timeout_s."""
        line, w = self._bell(local_rank)
        futex.wait(line.ctypes.data + 8 * w, seen, timeout_s)

    def write_message(self, text: str) -> None:
        raw = text.encode("utf-8", "replace")[:MESSAGE_BYTES]
        self._message[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.leader_line[MESSAGE_LEN] = len(raw)

    def read_message(self) -> str:
        n = int(self.leader_line[MESSAGE_LEN])
        return self._message[:n].tobytes().decode("utf-8", "replace")

    def close(self) -> None:
        """Drop this process's mapping. A view still held elsewhere keeps it
        alive (mmap refuses to close under exported buffers): it goes with
        the process then, and the name is unlinked already."""
        self.leader_line = self.rank_lines = self._message = self._data = None
        try:
            self._map.close()
        except BufferError:
            pass
