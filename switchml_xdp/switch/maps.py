"""What the control plane writes into a data plane and reads back: jobs,
members, slot resets and counters. `DataplaneMaps` is that interface; the
JobTable and the daemon use nothing else, whichever data plane runs.

`SwitchMaps` implements it over the XDP switch's pinned BPF maps (layout:
xdp/swml_maps.h), so any process can open them, not only the daemon; the
user-space data plane has its own in-memory implementation (userspace.py).
"""
from __future__ import annotations

import abc
import ctypes as ct
import os
from dataclasses import dataclass

from .. import wire
from ..bpf import PinnedMap, pin_dir
from ..layout import ctype, dtype

#: The per-job counters of the data plane (struct swml_job_stats), in order.
JOB_STATS_FIELDS: tuple[str, ...] = dtype("swml_job_stats").names
#: The per-port counters (struct swml_port_stats), each an array by port.
PORT_STATS_FIELDS: tuple[str, ...] = dtype("swml_port_stats").names


@dataclass(frozen=True)
class UplinkEntry:
    """A rack box's way up the tree for one job (struct swml_uplink): rounds
    complete among the box's own members go to the parent box as one member
    of the parent's job; the parent's RESULTs come back to `src_ip`:`src_port`.
    Everything from the parent's join reply but the uplink's own addresses."""
    ifindex: int          # the uplink port
    parent_ip: str
    parent_port: int      # the parent's data port
    parent_mac: str       # the next hop towards the parent on the uplink
    src_ip: str           # this box's address on the uplink
    src_port: int         # this box's data port
    src_mac: str          # the uplink's MAC
    job_id: int           # the job's id at the parent
    rank: int             # this box's rank in the parent's job
    key: int              # the parent job's data key
    result_key: bytes     # the parent job's result key (RESULTs from above are checked)
    auth: int = wire.AUTH_HEADER


@dataclass(frozen=True)
class JobPace:
    """One row of `job_pace` (struct swml_job_pace): what a job's RESULTs say
    of its share of the box."""
    rate_code: int = 0       # wire.pace_encode(kbit/s a rank may send); 0: no limit
    dscp: int | None = None  # the RESULTs' DSCP; None: left as the DATA had it

    @property
    def tos(self) -> int:
        return (self.dscp or 0) << 2


@dataclass(frozen=True)
class JobEntry:
    """What the data plane knows of a job (one row of the `jobs` map)."""
    world: int
    slot_base: int
    slot_count: int
    group_ip: str
    group_mac: str
    result_port: int
    key: int             # the job's data key (64 bits), which every DATA packet carries
    # The key of its RESULTs' authenticator (wire.RESULT_KEY_LEN bytes; only the
    # switch and the members hold it) and what the authenticator covers.
    result_key: bytes = bytes(wire.RESULT_KEY_LEN)
    auth: int = wire.AUTH_HEADER
    # The ranks that send to this box (bit r: rank r); None: 0..world-1. A
    # tree's boxes name theirs: a rack box its own members (`world` of them
    # complete a round), a parent each child by the lowest rank behind it.
    rank_mask: int | None = None
    uplink: UplinkEntry | None = None   # a rack box's job with a parent
    # Its lanes (a power of two): slot s's DATA comes from a rank's port + s mod
    # lanes, and its RESULT goes to result_port + s mod lanes (swml_maps.h).
    lanes: int = 1

    @property
    def ranks(self) -> int:
        """The rank mask the data plane checks DATA against."""
        if self.rank_mask is not None:
            return self.rank_mask
        return (1 << min(self.world, wire.MAX_WORLD)) - 1

    @property
    def sip_key(self) -> tuple[int, int]:
        """The result key as SipHash's k0, k1 (swml_maps.h, result_key)."""
        return sip_key(self.result_key)


def sip_key(result_key: bytes) -> tuple[int, int]:
    """A result key's two little-endian words, as the data planes store it."""
    return (int.from_bytes(result_key[:8], "little"), int.from_bytes(result_key[8:16], "little"))


class DataplaneMaps(abc.ABC):
    """A data plane's tables as the control plane sees them. Addresses and
    ports are given as text and ints; each implementation stores them as its
    data plane reads them."""

    @abc.abstractmethod
    def write_job(self, job_id: int, e: JobEntry) -> None:
        """Activate a job: its packets match from this call on."""

    @abc.abstractmethod
    def clear_job(self, job_id: int, world: int) -> None:
        """Deactivate a job first (packets stop matching), then its members."""

    @abc.abstractmethod
    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        """The one address `rank` of the job may send from."""

    def write_parent_route(self, parent_ip: str, parent_job: int, job_id: int) -> None:
        """RESULTs of job `parent_job` from the parent box at `parent_ip` are
        the local job `job_id`'s (a tree: docs/scale-out.md)."""
        raise NotImplementedError("this data plane has no uplink: a tree of boxes needs the xdp one")

    def clear_parent_route(self, parent_ip: str, parent_job: int) -> None:  # noqa: B027
        """Forget a route of write_parent_route (no error if there is none)."""

    @abc.abstractmethod
    def job_active(self, job_id: int) -> bool:
        """Whether the data plane takes packets of this job id."""

    @abc.abstractmethod
    def reset_slots(self, base: int, count: int) -> None:
        """Zero a range of slots so a new job starts with empty bitmaps/counts."""

    @abc.abstractmethod
    def read_counters(self) -> dict[str, int]:
        """Packets by outcome, one entry per name of wire.COUNTER_NAMES."""

    def read_port_stats(self, ports: int) -> list[dict[str, int]]:
        """Per port of the box, in its order: packets and bytes in and out
        (PORT_STATS_FIELDS); empty where the data plane does not count them."""
        return []

    @abc.abstractmethod
    def read_job_stats(self) -> dict[int, dict[str, int]]:
        """Per active job id: what the data plane did for it since it started,
        cumulative (JOB_STATS_FIELDS: packets, bytes, results, shadow_replies)."""

    @abc.abstractmethod
    def write_job_pace(self, job_id: int, pace: JobPace) -> None:
        """What the job's RESULTs carry of its share of the box (shares.py)."""

    @abc.abstractmethod
    def read_job_progress(self, job_ids) -> dict[int, tuple[int, int]]:
        """Per job id of `job_ids`: (frame bytes of DATA taken in, cumulative;
        the pace code its last DATA said, 0 if none)."""

    def close(self) -> None:  # noqa: B027 - optional: most maps hold nothing open
        """Release what the maps hold open (the data in them stays)."""


class SwitchMaps(DataplaneMaps):
    """The pinned maps of one XDP switch interface: jobs, members, slots,
    counters, job_stats."""

    def __init__(self, iface: str, k: int | None = None):
        self.dir = pin_dir(iface)
        self.Job, self.Member = ctype("swml_job"), ctype("swml_member")
        self.Uplink, self.Route = ctype("swml_uplink"), ctype("swml_parent_route")
        self.Slot = ctype("swml_slot", k) if k else None
        self.jobs = PinnedMap(f"{self.dir}/jobs", self.Job)
        self.members = PinnedMap(f"{self.dir}/members", self.Member)
        self.counters = PinnedMap(f"{self.dir}/counters", ct.c_uint64, percpu=True)
        self.job_stats = PinnedMap(f"{self.dir}/job_stats", ctype("swml_job_stats"), percpu=True)
        self.slots = PinnedMap(f"{self.dir}/slots", self.Slot) if self.Slot else None
        self.parent_routes = PinnedMap(f"{self.dir}/parent_routes", ct.c_uint32, key=self.Route)
        self.job_pace = PinnedMap(f"{self.dir}/job_pace", ctype("swml_job_pace"))
        self.job_left = PinnedMap(f"{self.dir}/job_left", ct.c_uint32)
        stats = f"{self.dir}/port_stats"   # not there: a data plane from before ports
        self.port_stats = (PinnedMap(stats, ctype("swml_port_stats"), percpu=True)
                           if os.path.exists(stats) else None)

    @staticmethod
    def exist(iface: str) -> bool:
        return os.path.exists(f"{pin_dir(iface)}/jobs")

    def close(self) -> None:
        for m in (self.jobs, self.members, self.counters, self.job_stats, self.slots,
                  self.port_stats, self.parent_routes, self.job_pace, self.job_left):
            if m is not None:
                m.close()

    # --- jobs and members ------------------------------------------------
    def write_job(self, job_id: int, e: JobEntry) -> None:
        v = self.Job(active=1, world=e.world, slot_base=e.slot_base, slot_count=e.slot_count,
                     key=wire.key_to_be64(e.key), group_ip=wire.ip_to_be32(e.group_ip),
                     result_port=wire.port_to_be16(e.result_port), auth=e.auth,
                     rank_mask=e.ranks, rank_end=e.ranks.bit_length(),
                     lane_mask=e.lanes - 1)
        v.result_key[0], v.result_key[1] = e.sip_key
        ct.memmove(v.group_mac, wire.mac_to_bytes(e.group_mac), 6)
        if e.uplink is not None:
            up = self.uplink_row(e.uplink)
            ct.memmove(v.up, ct.byref(up), ct.sizeof(up))
        self.job_stats.zero(job_id)
        self.job_left.update(job_id, ct.c_uint32(0))
        self.jobs.update(job_id, v)

    def clear_job(self, job_id: int, world: int) -> None:
        self.jobs.update(job_id, self.Job())
        self.job_pace.update(job_id, self.job_pace.value_type())
        for rank in range(min(world, wire.MAX_WORLD)):
            self.members.update(job_id * wire.MAX_WORLD + rank, self.Member())

    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        self.members.update(job_id * wire.MAX_WORLD + rank,
                            self.Member(ip=wire.ip_to_be32(ip), port=wire.port_to_be16(port)))

    def uplink_row(self, u: UplinkEntry):
        """A struct swml_uplink as the data plane reads it."""
        up = self.Uplink(ifindex=u.ifindex, parent_ip=wire.ip_to_be32(u.parent_ip),
                         src_ip=wire.ip_to_be32(u.src_ip),
                         parent_port=wire.port_to_be16(u.parent_port),
                         src_port=wire.port_to_be16(u.src_port),
                         job=wire.port_to_be16(u.job_id), rank=wire.port_to_be16(u.rank),
                         auth=u.auth, key=wire.key_to_be64(u.key))
        up.result_key[0], up.result_key[1] = sip_key(u.result_key)
        ct.memmove(up.parent_mac, wire.mac_to_bytes(u.parent_mac), 6)
        ct.memmove(up.src_mac, wire.mac_to_bytes(u.src_mac), 6)
        return up

    def write_parent_route(self, parent_ip: str, parent_job: int, job_id: int) -> None:
        self.parent_routes.update(self._route_key(parent_ip, parent_job), ct.c_uint32(job_id))

    def clear_parent_route(self, parent_ip: str, parent_job: int) -> None:
        self.parent_routes.delete(self._route_key(parent_ip, parent_job))

    def _route_key(self, parent_ip: str, parent_job: int):
        return self.Route(parent_ip=wire.ip_to_be32(parent_ip), parent_job=parent_job)

    def learnt_mac(self, job_id: int, rank: int) -> str | None:
        """The Ethernet source of the rank's last DATA packet that passed every
        check, which the switch program writes with --fanout unicast (where
        that rank's RESULTs go); None until one has."""
        mac = bytes(self.members.lookup(job_id * wire.MAX_WORLD + rank).mac)
        return wire.mac_from_bytes(mac) if any(mac) else None

    def read_job(self, job_id: int):
        """The whole `jobs` row (a swml_job structure)."""
        return self.jobs.lookup(job_id)

    def job_active(self, job_id: int) -> bool:
        return bool(self.read_job(job_id).active)

    # --- slots -----------------------------------------------------------
    def reset_slots(self, base: int, count: int) -> None:
        empty = self.Slot()
        for i in range(base, base + count):
            self.slots.update(i, empty)

    # --- counters --------------------------------------------------------
    def read_counters(self) -> dict[str, int]:
        return {name: sum(v.value for v in self.counters.lookup(i))
                for i, name in enumerate(wire.COUNTER_NAMES)}

    def read_port_stats(self, ports: int) -> list[dict[str, int]]:
        if self.port_stats is None:
            return []
        rows = self.port_stats.lookup(0)
        return [{f: sum(getattr(r, f)[n] for r in rows) for f in PORT_STATS_FIELDS}
                for n in range(ports)]

    def read_job_stats(self) -> dict[int, dict[str, int]]:
        out = {}
        for job_id in range(1, wire.MAX_JOBS):
            if self.jobs.lookup(job_id).active:
                rows = self.job_stats.lookup(job_id)
                out[job_id] = {f: sum(getattr(r, f) for r in rows) for f in JOB_STATS_FIELDS}
        return out

    # --- shares ----------------------------------------------------------
    def write_job_pace(self, job_id: int, pace: JobPace) -> None:
        row = self.job_pace.value_type(rate=wire.port_to_be16(pace.rate_code), tos=pace.tos,
                                       mark=int(pace.dscp is not None))
        self.job_pace.update(job_id, row)

    def read_job_progress(self, job_ids) -> dict[int, tuple[int, int]]:
        return {j: (sum(r.bytes for r in self.job_stats.lookup(j)), self.job_left.lookup(j).value)
                for j in job_ids}
