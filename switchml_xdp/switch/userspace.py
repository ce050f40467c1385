"""The user-space data plane: the same wire protocol as the XDP switch, served
by a thread of the daemon on a kernel UDP socket, no XDP
(`swml-switch up IFACE --dataplane userspace`).

It exists to measure what XDP buys (`swml-lab bench` runs it in the lab's
switch namespace as the "user-space switch" system), and as a fallback where
XDP cannot be loaded. The control plane is the daemon's, unchanged; what
differs from XDP:

- tables: `MemoryMaps`, the DataplaneMaps interface (maps.py) over numpy
  arrays (jobs, members, slots, counters) instead of pinned BPF maps; they die
  with the process, so a restarted daemon has nothing to adopt;
- packets: userspace_dp.c, the switch program's per-packet step in C,
  compiled at first use with the system compiler and called through ctypes on
  a thread of its own (the GIL is released for the whole loop). One thread,
  recvmmsg()/sendmmsg() in batches of up to 64 datagrams, RESULTs rewritten in
  place as the XDP program does. Every packet crosses the kernel's IP/UDP
  receive path into the socket and its RESULT the send path back, which is
  the cost XDP avoids.
"""
from __future__ import annotations

import ctypes as ct
import hashlib
import logging
import os
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from .. import bpf, net, wire
from ..layout import ctype, dtype, xdp_dir
from .data_port import hold_data_port
from .dataplane import Dataplane, DataplaneError, SwitchParams
from .maps import DataplaneMaps, JobEntry, JobPace

SOURCE = Path(__file__).with_name("userspace_dp.c")
RCVBUF = 32 << 20

log = logging.getLogger("swml.userspace")

# Layouts of struct us_job / us_member of userspace_dp.c, as the compiler lays them out.
JOB_DTYPE = dtype("us_job")
MEMBER_DTYPE = dtype("us_member")
JOB_STATS_DTYPE = dtype("swml_job_stats")
JOB_PACE_DTYPE = dtype("swml_job_pace")


# ------------------------------------------------------------------ the C part

def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "switchml-xdp"


def build_datapath() -> Path:
    """Compile userspace_dp.c (once per source version) and return the .so path."""
    included = ("swml_wire.h", "swml_maps.h", "swml_slot.h", "swml_auth.h")
    headers = [xdp_dir() / h for h in included]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [SOURCE, *headers])).hexdigest()[:16]
    out = _cache_dir() / f"swml_userspace_dp-{digest}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC", "cc")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    argv = [cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-Wall", f"-I{xdp_dir()}",
            "-o", tmp, str(SOURCE)]
    try:
        r = subprocess.run(argv, capture_output=True, text=True)
    except FileNotFoundError:
        os.unlink(tmp)
        raise DataplaneError(f"no C compiler ({cc}) to build {SOURCE.name} "
                             "(Debian package gcc)") from None
    if r.returncode != 0:
        os.unlink(tmp)
        raise DataplaneError(f"cannot compile {SOURCE.name}: {r.stderr.strip()[-2000:]}")
    os.replace(tmp, out)  # atomic: concurrent builders agree on the result
    return out


# struct us_state of userspace_dp.c: the table addresses the C loop works on.
_State = ctype("us_state")


def load_datapath() -> ct.CDLL:
    lib = ct.CDLL(str(build_datapath()))
    for name, size in (("swml_us_state_size", ct.sizeof(_State)),
                       ("swml_us_job_size", JOB_DTYPE.itemsize),
                       ("swml_us_member_size", MEMBER_DTYPE.itemsize)):
        fn = getattr(lib, name)
        fn.restype = ct.c_size_t
        if fn() != size:
            raise DataplaneError(f"{SOURCE.name} and userspace.py disagree on a layout ({name})")
    lib.swml_us_run.restype = ct.c_int
    lib.swml_us_run.argtypes = [ct.c_int, ct.POINTER(_State)]
    return lib


# ------------------------------------------------------------------ the maps

class MemoryMaps(DataplaneMaps):
    """The DataplaneMaps interface over numpy arrays that the C loop reads and
    writes directly. Addresses and ports are kept in network byte order, as in
    the BPF maps."""

    def __init__(self, k: int, slots: int):
        self.k, self.nslots = k, slots
        self.jobs = np.zeros(wire.MAX_JOBS, JOB_DTYPE)
        self.members = np.zeros(wire.MAX_JOBS * wire.MAX_WORLD, MEMBER_DTYPE)
        self.seen = np.zeros((slots, 2), np.uint64)
        self.seq = np.zeros((slots, 2), np.uint32)
        self.count = np.zeros((slots, 2), np.uint32)
        self.tag = np.zeros((slots, 2), np.uint32)
        self.op = np.zeros((slots, 2), np.uint8)
        self.exp = np.zeros((slots, 2), np.int8)
        self.flags = np.zeros((slots, 2), np.uint8)
        self.vals = np.zeros((slots, 2, k), np.int32)
        self.counters = np.zeros(wire.CNT_NUM, np.uint64)
        self.job_stats = np.zeros(wire.MAX_JOBS, JOB_STATS_DTYPE)
        self.job_pace = np.zeros(wire.MAX_JOBS, JOB_PACE_DTYPE)
        self.job_left = np.zeros(wire.MAX_JOBS, np.uint32)
        self.stop = np.zeros(1, np.uint32)

    def c_state(self) -> _State:
        tables = ("jobs", "members", "seen", "seq", "count", "tag", "op", "exp", "flags", "vals",
                  "counters", "job_stats", "job_pace", "job_left", "stop")
        return _State(k=self.k, nslots=self.nslots, **{t: getattr(self, t).ctypes.data for t in tables})

    # --- jobs and members -------------------------------------------------------
    def write_job(self, job_id: int, e: JobEntry) -> None:
        row = self.jobs[job_id]
        row["world"], row["slot_base"], row["slot_count"] = e.world, e.slot_base, e.slot_count
        row["key"] = wire.key_to_be64(e.key)
        row["group_ip"] = wire.ip_to_be32(e.group_ip)
        row["result_port"] = wire.port_to_be16(e.result_port)
        row["lane_mask"] = e.lanes - 1
        row["result_key"], row["auth"] = e.sip_key, e.auth
        self.job_stats[job_id] = np.zeros((), JOB_STATS_DTYPE)
        self.job_left[job_id] = 0
        row["active"] = 1          # last: the data plane matches the job from now on

    def clear_job(self, job_id: int, world: int) -> None:
        self.jobs[job_id]["active"] = 0   # first: packets stop matching
        self.jobs[job_id] = np.zeros((), JOB_DTYPE)
        self.job_pace[job_id] = np.zeros((), JOB_PACE_DTYPE)
        base = job_id * wire.MAX_WORLD
        self.members[base:base + min(world, wire.MAX_WORLD)] = np.zeros((), MEMBER_DTYPE)

    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        row = self.members[job_id * wire.MAX_WORLD + rank]
        row["ip"], row["port"] = wire.ip_to_be32(ip), wire.port_to_be16(port)

    def job_active(self, job_id: int) -> bool:
        return bool(self.jobs[job_id]["active"])

    # --- slots -----------------------------------------------------------------
    def reset_slots(self, base: int, count: int) -> None:
        s = slice(base, base + count)
        self.seen[s] = 0
        self.seq[s] = 0
        self.count[s] = 0
        self.tag[s] = 0
        self.op[s] = 0
        self.exp[s] = 0
        self.flags[s] = 0
        self.vals[s] = 0

    # --- counters --------------------------------------------------------------
    def read_counters(self) -> dict[str, int]:
        return {name: int(self.counters[i]) for i, name in enumerate(wire.COUNTER_NAMES)}

    def read_job_stats(self) -> dict[int, dict[str, int]]:
        active = np.flatnonzero(self.jobs["active"])
        return {int(j): {f: int(self.job_stats[j][f]) for f in JOB_STATS_DTYPE.names}
                for j in active}

    def write_job_pace(self, job_id: int, pace: JobPace) -> None:
        self.job_pace[job_id] = (wire.port_to_be16(pace.rate_code), pace.tos,
                                 int(pace.dscp is not None))

    def read_job_progress(self, job_ids) -> dict[int, tuple[int, int]]:
        return {j: (int(self.job_stats[j]["bytes"]), int(self.job_left[j])) for j in job_ids}



# ------------------------------------------------------------------ the data plane

def data_socket(ip: str, port: int, ifindex: int) -> socket.socket:
    """The UDP socket of the data plane: it holds (ip, port) as data_port.py
    says, RESULTs to the jobs' multicast groups leave by `ifindex`, never
    looped back."""
    s = hold_data_port(ip, port, rcvbuf=None)
    try:
        for opt in (33, socket.SO_RCVBUF):          # SO_RCVBUFFORCE (root), else capped
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
                break
            except PermissionError:
                continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        # struct ip_mreqn: multiaddr (unused), address, ifindex.
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                     struct.pack("=4s4si", bytes(4), socket.inet_aton(ip), ifindex))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    except OSError as e:
        s.close()
        raise DataplaneError(f"cannot open the data socket on {ip}:{port}: {e.strerror}") from None
    return s


class UserspaceDataplane(Dataplane):
    """The C loop on a thread of the daemon, over MemoryMaps and one UDP socket."""

    name = "userspace"
    needs_root = False
    holds_data_port = True
    label = "user-space process"
    mode = "user-space"

    def __init__(self, iface: str, params: SwitchParams):
        super().__init__(iface, params)
        self._lib: ct.CDLL | None = None
        self._sock: socket.socket | None = None
        self._state: _State | None = None
        self._thread: threading.Thread | None = None
        self.error = 0

    def check_free(self, state: dict | None) -> None:
        try:
            att = bpf.attachment(self.iface)
        except bpf.XdpError as e:
            raise DataplaneError(str(e)) from None
        if att.mode is not None:
            raise DataplaneError(f"{self.iface} has an XDP program attached (id {att.prog_id}), which "
                                 f"sees the switch's packets before this process would; "
                                 f"`swml-switch down {self.iface}` or detach it first")

    def open(self, ip: str, adopt: dict | None) -> MemoryMaps:
        try:
            ifindex = net.link_index(self.iface)
        except net.NetError as e:
            raise DataplaneError(str(e)) from None
        self._lib = load_datapath()
        self.maps = MemoryMaps(self.params.k, self.params.slots)
        self._state = self.maps.c_state()
        self._sock = data_socket(ip, self.params.port, ifindex)
        return self.maps

    def start(self, adopt: dict | None) -> None:
        def loop():
            self.error = self._lib.swml_us_run(self._sock.fileno(), ct.byref(self._state))
            if self.error:
                log.error("data plane stopped: %s", os.strerror(-self.error))
        self._thread = threading.Thread(target=loop, name="swml-us-dp", daemon=True)
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self.maps.stop[0] = 1   # the loop looks at it between batches
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()

    def status_extra(self) -> dict:
        return {"batches": self._state.batches, "datagrams": self._state.batched}

