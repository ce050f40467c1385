"""A user-space aggregation switch: the same wire protocol and control protocol
as `swml-switch up`, from a plain process on a kernel UDP socket, no XDP.

It exists to measure what XDP buys (`swml-lab bench` runs it in the lab's
switch namespace as the "user-space switch" system), and as a fallback where
XDP cannot be loaded. What it is:

- control plane: the daemon's own JobTable (jobs.py) and ControlServer
  (control.py), unchanged, over `MemoryMaps`, an in-memory implementation of
  the SwitchMaps interface (maps.py): jobs, members, slots and counters are
  numpy arrays instead of BPF maps;
- data plane: userspace_dp.c, the switch program's per-packet logic in C,
  compiled at first use with the system compiler and called through ctypes on
  a thread of its own (the GIL is released for the whole loop). One thread,
  recvmmsg()/sendmmsg() in batches of up to 64 datagrams, RESULTs rewritten in
  place as the XDP program does. Every packet crosses the kernel's IP/UDP
  receive path into the socket and its RESULT the send path back, which is
  the cost XDP avoids.

Run it with `python -m switchml_xdp.switch.userspace up IFACE [--elements K]
...` (the options of `swml-switch up`, less --mode). It prints the same
"swml-switch: up on IFACE (...)" line when it serves, and stops on
Ctrl-C/SIGTERM.
"""
from __future__ import annotations

import asyncio
import ctypes as ct
import hashlib
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import wire
from ..cheaders import xdp_dir
from .dataplane import DataplaneError, SwitchParams
from .jobs import JobTable
from .maps import JobEntry

SOURCE = Path(__file__).with_name("userspace_dp.c")
DEFAULT_JOB_SLOTS = 128
DEFAULT_LEASE_S = 3.0
RCVBUF = 32 << 20

log = logging.getLogger("swml.userspace")

# Layouts of struct us_job / us_member in userspace_dp.c (checked at load).
JOB_DTYPE = np.dtype([("active", "<u4"), ("world", "<u4"), ("slot_base", "<u4"),
                      ("slot_count", "<u4"), ("group_ip", "<u4"), ("result_port", "<u2"),
                      ("pad", "<u2")])
MEMBER_DTYPE = np.dtype([("ip", "<u4"), ("port", "<u2"), ("pad", "<u2")])


class UserspaceError(RuntimeError):
    """Why the user-space switch cannot run, in one line."""


# ------------------------------------------------------------------ the C part

def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "switchml-xdp"


def build_datapath() -> Path:
    """Compile userspace_dp.c (once per source version) and return the .so path."""
    headers = [xdp_dir() / h for h in ("swml_wire.h", "swml_slot.h")]  # what it includes
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
        raise UserspaceError(f"no C compiler ({cc}) to build {SOURCE.name} "
                             "(Debian package gcc)") from None
    if r.returncode != 0:
        os.unlink(tmp)
        raise UserspaceError(f"cannot compile {SOURCE.name}: {r.stderr.strip()[-2000:]}")
    os.replace(tmp, out)  # atomic: concurrent builders agree on the result
    return out


class _State(ct.Structure):
    _fields_ = [("k", ct.c_uint32), ("nslots", ct.c_uint32),
                ("jobs", ct.c_void_p), ("members", ct.c_void_p),
                ("seen", ct.c_void_p), ("count", ct.c_void_p), ("exp", ct.c_void_p),
                ("flags", ct.c_void_p), ("vals", ct.c_void_p), ("counters", ct.c_void_p),
                ("stop", ct.c_void_p), ("batches", ct.c_uint64), ("batched", ct.c_uint64)]


def load_datapath() -> ct.CDLL:
    lib = ct.CDLL(str(build_datapath()))
    for name, size in (("swml_us_state_size", ct.sizeof(_State)),
                       ("swml_us_job_size", JOB_DTYPE.itemsize),
                       ("swml_us_member_size", MEMBER_DTYPE.itemsize)):
        fn = getattr(lib, name)
        fn.restype = ct.c_size_t
        if fn() != size:
            raise UserspaceError(f"{SOURCE.name} and userspace.py disagree on a layout ({name})")
    lib.swml_us_run.restype = ct.c_int
    lib.swml_us_run.argtypes = [ct.c_int, ct.POINTER(_State)]
    return lib


# ------------------------------------------------------------------ the maps

class MemoryMaps:
    """The SwitchMaps interface (what JobTable and the daemon call) over numpy
    arrays that the C loop reads and writes directly. Addresses and ports are
    kept in network byte order, as in the BPF maps."""

    def __init__(self, k: int, slots: int):
        self.k, self.nslots = k, slots
        self.jobs = np.zeros(wire.MAX_JOBS, JOB_DTYPE)
        self.members = np.zeros(wire.MAX_JOBS * wire.MAX_WORLD, MEMBER_DTYPE)
        self.seen = np.zeros((slots, 2), np.uint64)
        self.count = np.zeros((slots, 2), np.uint32)
        self.exp = np.zeros((slots, 2), np.int8)
        self.flags = np.zeros((slots, 2), np.uint8)
        self.vals = np.zeros((slots, 2, k), np.int32)
        self.counters = np.zeros(wire.CNT_NUM, np.uint64)
        self.stop = np.zeros(1, np.uint32)

    def c_state(self) -> _State:
        p = lambda a: a.ctypes.data  # noqa: E731
        return _State(self.k, self.nslots, p(self.jobs), p(self.members), p(self.seen),
                      p(self.count), p(self.exp), p(self.flags), p(self.vals),
                      p(self.counters), p(self.stop), 0, 0)

    def close(self) -> None:
        pass

    # --- jobs and members (same calls as maps.SwitchMaps) ---------------------
    def write_job(self, job_id: int, e: JobEntry) -> None:
        row = self.jobs[job_id]
        row["world"], row["slot_base"], row["slot_count"] = e.world, e.slot_base, e.slot_count
        row["group_ip"] = wire.ip_to_be32(e.group_ip)
        row["result_port"] = wire.port_to_be16(e.result_port)
        row["active"] = 1          # last: the data plane matches the job from now on

    def clear_job(self, job_id: int, world: int) -> None:
        self.jobs[job_id]["active"] = 0   # first: packets stop matching
        self.jobs[job_id] = np.zeros((), JOB_DTYPE)
        base = job_id * wire.MAX_WORLD
        self.members[base:base + min(world, wire.MAX_WORLD)] = np.zeros((), MEMBER_DTYPE)

    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        row = self.members[job_id * wire.MAX_WORLD + rank]
        row["ip"], row["port"] = wire.ip_to_be32(ip), wire.port_to_be16(port)

    def read_job(self, job_id: int):
        return self.jobs[job_id]

    # --- slots -----------------------------------------------------------------
    def reset_slots(self, base: int, count: int) -> None:
        s = slice(base, base + count)
        self.seen[s] = 0
        self.count[s] = 0
        self.exp[s] = 0
        self.flags[s] = 0
        self.vals[s] = 0

    def read_slot(self, index: int) -> dict:
        return {"seen": self.seen[index].tolist(), "count": self.count[index].tolist(),
                "exp": self.exp[index].tolist(), "flags": self.flags[index].tolist(),
                "vals": self.vals[index].copy()}

    # --- counters --------------------------------------------------------------
    def read_counters(self) -> dict[str, int]:
        return {name: int(self.counters[i]) for i, name in enumerate(wire.COUNTER_NAMES)}


# ------------------------------------------------------------------ the switch

def iface_address(iface: str) -> tuple[str, str, int]:
    """(IPv4, MAC, ifindex) of an interface in this network namespace."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=iface)
        if not idx:
            raise UserspaceError(f"no interface named {iface!r} in this network namespace")
        link = ipr.get_links(idx[0])[0]
        addrs = ipr.get_addr(index=idx[0], family=socket.AF_INET)
    if not addrs:
        raise UserspaceError(f"{iface} has no IPv4 address; the switch answers on its address")
    return addrs[0].get_attr("IFA_ADDRESS"), link.get_attr("IFLA_ADDRESS"), idx[0]


def data_socket(ip: str, port: int, ifindex: int) -> socket.socket:
    """The UDP socket of the data plane: bound to (ip, port), RESULTs to the
    jobs' multicast groups leave by `ifindex`, never looped back."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for opt in (33, socket.SO_RCVBUF):          # SO_RCVBUFFORCE (root), else capped
            try:
                s.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
                break
            except PermissionError:
                continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        s.bind((ip, port))
        # struct ip_mreqn: multiaddr (unused), address, ifindex.
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                     struct.pack("=4s4si", bytes(4), socket.inet_aton(ip), ifindex))
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    except OSError as e:
        s.close()
        raise UserspaceError(f"cannot open the data socket on {ip}:{port}: {e.strerror}") from None
    return s


class UserspaceSwitch:
    """Data plane thread + job table + control server, on one interface."""

    def __init__(self, iface: str, params: SwitchParams, control_port: int,
                 job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S):
        try:
            params.validate()
        except DataplaneError as e:
            raise UserspaceError(str(e)) from None
        self.iface, self.params, self.control_port = iface, params, control_port
        self.job_slots, self.lease_s = job_slots, lease_s
        self.ip, self.mac, self.ifindex = iface_address(iface)
        self.lib = load_datapath()
        self.maps = MemoryMaps(params.k, params.slots)
        self.table = JobTable(self.maps, params.k, params.slots, job_slots)
        self.sock = data_socket(self.ip, params.port, self.ifindex)
        self._state = self.maps.c_state()
        self._thread: threading.Thread | None = None
        self.error: int = 0
        self.started = time.time()

    def switch_info(self) -> dict:
        return {"iface": self.iface, "ip": self.ip, "mac": self.mac, "port": self.params.port}

    def status_extra(self) -> dict:
        return {"counters": self.maps.read_counters(), "mode": "user-space",
                "params": asdict(self.params),
                "batches": self._state.batches, "datagrams": self._state.batched}

    def start_datapath(self) -> None:
        def loop():
            self.error = self.lib.swml_us_run(self.sock.fileno(), ct.byref(self._state))
            if self.error:
                log.error("data plane stopped: %s", os.strerror(-self.error))
        self._thread = threading.Thread(target=loop, name="swml-us-dp", daemon=True)
        self._thread.start()

    def stop_datapath(self) -> None:
        self.maps.stop[0] = 1
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sock.close()

    async def serve(self, ready_cb=None) -> None:
        from .control import ControlServer

        server = ControlServer(self.table, self.switch_info(), self.lease_s, self.status_extra)
        try:
            await server.start(self.ip, self.control_port)
        except OSError as e:
            raise UserspaceError(f"cannot listen on {self.ip}:{self.control_port}: {e.strerror}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready_cb:
            ready_cb()
        await stop.wait()
        await server.stop("the switch is shutting down")
        await asyncio.sleep(0.05)


def run(iface: str, params: SwitchParams, control_port: int, job_slots: int = DEFAULT_JOB_SLOTS,
        lease_s: float = DEFAULT_LEASE_S) -> dict:
    """Serve until SIGINT/SIGTERM; returns the final counters."""
    t0 = time.monotonic()
    sw = UserspaceSwitch(iface, params, control_port, job_slots, lease_s)
    sw.start_datapath()

    def ready():
        print(f"swml-switch: up on {iface} (user-space process, k={params.k}, {params.slots} slots, "
              f"data {sw.ip}:{params.port}, control {sw.ip}:{control_port}) "
              f"in {time.monotonic() - t0:.2f} s", flush=True)

    try:
        asyncio.run(sw.serve(ready))
    finally:
        sw.stop_datapath()
        counters = sw.maps.read_counters()
        print(f"swml-switch: {iface} user-space switch stopped; counters "
              f"{ {k: v for k, v in counters.items() if v} }", file=sys.stderr, flush=True)
    return counters


def main(argv: list[str] | None = None) -> None:
    import click

    from .daemon import DEFAULT_JOB_SLOTS as JS, DEFAULT_LEASE_S as LS

    @click.group(context_settings={"help_option_names": ["-h", "--help"]})
    def cli() -> None:
        """switchml-xdp aggregation switch as a user-space process (no XDP)."""

    @cli.command()
    @click.argument("iface")
    @click.option("--elements", "-k", type=click.IntRange(1, wire.MAX_K), default=wire.DEFAULT_K,
                  show_default=True, help="int32 elements a packet (fixed for the switch)")
    @click.option("--slots", type=click.IntRange(1, 65535), default=wire.DEFAULT_SLOTS,
                  show_default=True, help="aggregation slots shared by all jobs")
    @click.option("--job-slots", type=click.IntRange(1, 65535), default=JS, show_default=True,
                  help="slots a job gets (its window), if that many are free")
    @click.option("--port", type=click.IntRange(1, 65535), default=wire.DEFAULT_PORT,
                  show_default=True, help="UDP port of the data plane")
    @click.option("--control-port", type=click.IntRange(1, 65535),
                  default=wire.DEFAULT_CONTROL_PORT, show_default=True,
                  help="TCP port of the control protocol")
    @click.option("--lease", type=click.FloatRange(0.2, 600), default=LS, show_default=True,
                  help="seconds without a heartbeat before a job is aborted")
    @click.option("-v", "--verbose", is_flag=True, help="log joins, leaves and aborts")
    def up(iface, elements, slots, job_slots, port, control_port, lease, verbose):
        """Serve IFACE's address as a user-space switch until Ctrl-C."""
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                            format="swml-switch: %(message)s")
        try:
            run(iface, SwitchParams(elements, slots, port), control_port, job_slots, lease)
        except UserspaceError as e:
            raise click.ClickException(str(e)) from None

    cli(argv)


if __name__ == "__main__":
    main()
