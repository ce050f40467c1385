"""Typed access to the switch's pinned maps (layout: xdp/swml_maps.h)."""
from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass

from .. import wire
from ..bpf import PIN_ROOT, PinnedMap, pin_dir  # noqa: F401  (PIN_ROOT: old importers)
from ..cheaders import structs


@dataclass(frozen=True)
class JobEntry:
    """What the data plane knows of a job (one row of the `jobs` map)."""
    world: int
    slot_base: int
    slot_count: int
    group_ip: str
    group_mac: str
    result_port: int


def _mac_bytes(mac: str) -> bytes:
    return bytes(int(b, 16) for b in mac.split(":"))


class SwitchMaps:
    """The four maps of one switch interface: jobs, members, slots, counters."""

    def __init__(self, iface: str, k: int | None = None):
        self.dir = pin_dir(iface)
        types = structs("swml_maps.h", {"SWML_K": k} if k else None)
        self.Job, self.Member = types["swml_job"], types["swml_member"]
        self.Slot = types.get("swml_slot")
        self.jobs = PinnedMap(f"{self.dir}/jobs", self.Job)
        self.members = PinnedMap(f"{self.dir}/members", self.Member)
        self.counters = PinnedMap(f"{self.dir}/counters", ct.c_uint64, percpu=True)
        self.slots = PinnedMap(f"{self.dir}/slots", self.Slot) if self.Slot else None

    @staticmethod
    def exist(iface: str) -> bool:
        return os.path.exists(f"{pin_dir(iface)}/jobs")

    def close(self) -> None:
        for m in (self.jobs, self.members, self.counters, self.slots):
            if m is not None:
                m.close()

    # --- jobs and members ------------------------------------------------
    def write_job(self, job_id: int, e: JobEntry) -> None:
        v = self.Job(active=1, world=e.world, slot_base=e.slot_base, slot_count=e.slot_count,
                     group_ip=wire.ip_to_be32(e.group_ip),
                     result_port=wire.port_to_be16(e.result_port))
        ct.memmove(v.group_mac, _mac_bytes(e.group_mac), 6)
        self.jobs.update(job_id, v)

    def clear_job(self, job_id: int, world: int) -> None:
        """Deactivate a job first (packets stop matching), then its members."""
        self.jobs.update(job_id, self.Job())
        for rank in range(min(world, wire.MAX_WORLD)):
            self.members.update(job_id * wire.MAX_WORLD + rank, self.Member())

    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        self.members.update(job_id * wire.MAX_WORLD + rank,
                            self.Member(ip=wire.ip_to_be32(ip), port=wire.port_to_be16(port)))

    def read_job(self, job_id: int):
        return self.jobs.lookup(job_id)

    # --- slots -----------------------------------------------------------
    def reset_slots(self, base: int, count: int) -> None:
        """Zero a range of slots so a new job starts with empty bitmaps/counts."""
        empty = self.Slot()
        for i in range(base, base + count):
            self.slots.update(i, empty)

    def read_slot(self, index: int):
        return self.slots.lookup(index)

    # --- counters --------------------------------------------------------
    def read_counters(self) -> dict[str, int]:
        return {name: sum(v.value for v in self.counters.lookup(i))
                for i, name in enumerate(wire.COUNTER_NAMES)}
