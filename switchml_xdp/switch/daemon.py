"""`swml-switch up`: open a data plane on an interface and serve the control
protocol in the foreground until Ctrl-C / SIGTERM, then stop cleanly. One
daemon and one serve loop, whichever data plane (dataplane.py) it drives.

Another shell finds a running switch through its state files, and one
daemon an interface is kept by a lock on a file beside them: both are
state_files.py's.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict

from .. import mtu, wire
from ..net import NetError
from . import descriptors
from .capacity import capacity_bps as box_capacity_bps
from .control import ControlServer
from .data_port import hold_data_port
from .dataplane import DEFAULT_FANOUT, Dataplane, DataplaneError, SwitchParams, netns_inode
from .jobs import JobTable
from .metrics import MetricsError, MetricsServer, SwitchCollector
from .ports import box_address
from .shares import ShareConfig, Shares, keep_shares
from .state_files import (
    LockError,
    lock_holder,
    read_state,
    read_token_digests,
    remove_state,
    take_lock,
    write_operator_token,
    write_state,
)
from .uplink import ParentLink, uplink_port
from .userspace import UserspaceDataplane
from .xdp_dataplane import XdpDataplane

DEFAULT_JOB_SLOTS = 128
DEFAULT_LEASE_S = 3.0
DATAPLANES: dict[str, type[Dataplane]] = {"xdp": XdpDataplane, "userspace": UserspaceDataplane}

log = logging.getLogger("swml.switch")


class SwitchError(RuntimeError):
    """A reason `up` or `down` cannot proceed, for the user in one line."""


def make_dataplane(name: str, iface: str, params: SwitchParams, mode: str | None = None,
                   fanout: str | None = None, ports: list[str] | None = None,
                   uplink: str | None = None) -> Dataplane:
    """The data plane called `name` (a key of DATAPLANES); `mode`, a
    unicast `fanout`, several `ports` (iface first) and a rack box's
    `uplink` are XDP's only."""
    try:
        if name == "xdp":
            return XdpDataplane(iface, params, mode, fanout, ports, uplink)
        if uplink is not None:
            raise SwitchError(f"a rack box (--uplink, --parent) needs the xdp data plane; the "
                              f"{name} data plane cannot send rounds up to a parent box")
        if ports and len(ports) > 1:
            raise SwitchError(f"a box with several ports needs the xdp data plane; the {name} "
                              f"data plane serves one interface")
        if mode is not None:
            raise SwitchError(f"--mode is the XDP data plane's (native or generic); "
                              f"the {name} data plane has none")
        if fanout not in (None, DEFAULT_FANOUT):
            raise SwitchError(f"--fanout {fanout} needs the xdp data plane; the {name} data "
                              f"plane sends RESULTs by {DEFAULT_FANOUT} only")
        return DATAPLANES[name](iface, params)
    except DataplaneError as e:
        raise SwitchError(str(e)) from None


def check_port_mtus(ports: list[str], k: int) -> None:
    """Refuse a k whose packets a port's MTU does not carry (mtu.py), in one line."""
    try:
        for port in ports:
            mtu.check_iface(k, port)
    except (mtu.MtuError, NetError) as e:
        raise SwitchError(f"--elements: {e}") from None


def read_job_stats(maps) -> dict[str, dict[str, int]] | None:
    """Per job id (as text, as JSON has it) its cumulative packets, bytes,
    results and shadow replies, where the data plane counts them
    (`DataplaneMaps.read_job_stats`); None where it does not."""
    read = getattr(maps, "read_job_stats", None)
    if read is None:
        return None
    return {str(job_id): dict(stats) for job_id, stats in read().items()}


def iface_address(ports: list[str]) -> tuple[str, str]:
    """(IPv4, MAC) of the box whose ports these are, in this network
    namespace: one port's own, or their bridge's (switch/ports.py)."""
    try:
        return box_address(ports)[:2]
    except DataplaneError as e:
        raise SwitchError(str(e)) from None


class Switch:
    """One switch on one interface: data plane + job table + control server."""

    def __init__(self, dataplane: Dataplane, control_port: int,
                 job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S,
                 require_token: bool = False, initial_seq: int = 0, auth: str = "header",
                 capacity_bps: int | None = None, parent: tuple[str, int] | None = None,
                 share: ShareConfig | None = None):
        """capacity_bps: what joiners are told the box carries (switch/capacity.py;
        None: the port's link speed, where the kernel knows it). parent: a
        rack box's parent box (address, control port), reached through the
        data plane's uplink (docs/scale-out.md, "A tree of boxes")."""
        self.parent = parent
        self.share = share    # `--share`: the policy between jobs (shares.py)
        self.operator_token: str | None = None
        self.link: ParentLink | None = None
        self.dp, self.iface, self.params = dataplane, dataplane.iface, dataplane.params
        if capacity_bps is not None and capacity_bps <= 0:
            raise SwitchError(f"--capacity must be above zero, got {capacity_bps}")
        self.configured_capacity_bps = capacity_bps
        self.capacity_bps: int | None = capacity_bps
        if auth not in wire.AUTH_MODES:
            raise SwitchError(f"--auth must be one of {', '.join(wire.AUTH_MODES)}, got {auth!r}")
        self.auth = auth  # what RESULT authenticators cover (docs/security.md)
        self.control_port, self.job_slots, self.lease_s = control_port, job_slots, lease_s
        self.require_token, self.initial_seq = require_token, initial_seq
        self._lock_fd: int | None = None
        self._data_port: socket.socket | None = None   # where the data plane does not hold it
        self.table: JobTable | None = None
        self.server: ControlServer | None = None
        self.started = time.time()
        self.ip = self.mac = None
        self._wrote_state = False

    # --- bring-up and tear-down ------------------------------------------
    def load(self) -> None:
        if self.dp.needs_root and os.geteuid() != 0:
            raise SwitchError(f"swml-switch up needs root for the {self.dp.name} data plane "
                              "(XDP, bpffs)")
        if not 1 <= self.control_port <= 65535:
            raise SwitchError(f"--control-port must be in 1..65535, got {self.control_port}")
        self.ip, self.mac = iface_address(self.dp.ports)
        check_port_mtus([*self.dp.ports, *filter(None, [getattr(self.dp, "uplink", None)])], self.params.k)
        if self.parent is not None:
            try:
                self.link = ParentLink(uplink_port(self.dp.uplink), self.parent[0], self.parent[1],
                                       self.params.port)
            except NetError as e:
                raise SwitchError(f"the uplink: {e}") from None
        self.capacity_bps = box_capacity_bps(self.dp.ports, self.configured_capacity_bps)
        if self.share is not None and not self.capacity_bps:
            raise SwitchError(f"--share divides the box's capacity, which the kernel does not "
                              f"know for {', '.join(self.dp.ports)}: give --capacity RATE")
        if self.share is not None and self.share.dscp and self.dp.name != "xdp":
            raise SwitchError("--dscp marks RESULTs in the xdp data plane only")
        descriptors.raise_limit()
        # Before anything is loaded: a second `up`, however close behind, stops here.
        try:
            self._lock_fd = take_lock(self.iface)
        except LockError as e:
            raise SwitchError(str(e)) from None
        st = read_state(self.iface)
        self.dp.check_free(st)
        adopt = self._adoptable(st)
        if not self.dp.holds_data_port:
            self._data_port = hold_data_port(self.ip, self.params.port)
        if adopt and adopt.get("mode") == "generic" and getattr(self.dp, "requested_mode", "") is None:
            print(f"swml-switch: {self.iface}: taking over the previous switch, in its generic XDP "
                  f"mode, so that its jobs go on; for native XDP, `swml-switch down {self.iface}` "
                  f"first", file=sys.stderr, flush=True)
        maps = self.dp.open(self.ip, adopt)
        self.table = JobTable(maps, self.params.k, self.params.slots, self.job_slots,
                              on_change=self.write_state, require_token=self.require_token,
                              initial_seq=self.initial_seq, auth=self.auth,
                              below_parent=self.link is not None)
        if self.share is not None:
            self.table.shares = Shares(self.share.policy, self.capacity_bps, maps,
                                       self.share.max_weight, self.share.dscp,
                                       packet_bytes=4 * self.params.k)
        self.operator_token = write_operator_token(self.iface)
        if adopt is not None:
            self._adopt(adopt)
        self.dp.start(adopt)
        self.write_state()

    def _adoptable(self, st: dict | None) -> dict | None:
        """The state of a daemon that died while its data plane kept running on
        this interface with the same parameters: its jobs can be taken over."""
        # (We hold the interface's lock: whoever wrote `st` is gone.)
        if (not st or st.get("dataplane") != self.dp.name
                or not self.dp.can_adopt(st)):
            return None
        if st.get("params") != asdict(self.params):
            if st.get("jobs"):
                print(f"swml-switch: the previous switch on {self.iface} ran with {st['params']}; "
                      f"its {len(st['jobs'])} job(s) are discarded", file=sys.stderr)
            return None
        return st

    def _adopt(self, st: dict) -> None:
        running = [j for j in st.get("jobs", []) if j["state"] == "running"]
        if self.link is not None and running:
            # Its connections to the parent closed with it: the parent aborted them.
            print(f"swml-switch: the previous rack box's {len(running)} job(s) on {self.iface} are "
                  f"discarded (the parent box aborted them when it went)", file=sys.stderr)
            running = []
        active = {j["id"] for j in running}
        for job_id in range(1, wire.MAX_JOBS):  # joins the old daemon never finished
            if job_id not in active and self.dp.maps.job_active(job_id):
                self.dp.maps.clear_job(job_id, wire.MAX_WORLD)
        digests = read_token_digests(self.iface)
        for desc in running:
            if desc.get("protected") and desc["name"] not in digests:
                print(f"swml-switch: job {desc['name']!r} of the previous daemon had a token that "
                      f"was not kept; it is discarded", file=sys.stderr)
                self.dp.maps.clear_job(desc["id"], wire.MAX_WORLD)
                continue
            digest = digests.get(desc["name"]) if desc.get("protected") else None
            self.table.adopt(desc, bytes.fromhex(digest) if digest else None)
        print(f"swml-switch: re-adopted {len(running)} running job(s) of the previous daemon "
              f"(pid {st['pid']}) on {self.iface}; their workers have {self.lease_s:g} s to resume",
              file=sys.stderr, flush=True)

    def unload(self) -> dict[str, int]:
        """Stop the data plane, remove the state file; returns the final counters."""
        if self._lock_fd is None:   # another daemon's interface: touch nothing
            return {}
        counters = self.dp.maps.read_counters() if self.dp.maps is not None else {}
        self.dp.close()
        if self._data_port is not None:
            self._data_port.close()
        if self._wrote_state:
            remove_state(self.iface)
        os.close(self._lock_fd)   # the next `up` may start
        self._lock_fd = None
        return counters

    def switch_info(self) -> dict:
        """What joiners are told of the switch (and `status` shows)."""
        return {"iface": self.iface, "ip": self.ip, "mac": self.mac, "port": self.params.port,
                "fanout": self.dp.fanout, "auth": self.auth, "capacity_bps": self.capacity_bps,
                "ports": self.dp.ports,
                # a rack box: its members' rounds go on up (no 16-bit rounds)
                **({"parent": self.parent[0]} if self.parent is not None else {})}

    def write_state(self) -> None:
        st = {"iface": self.iface, "pid": os.getpid(), "params": asdict(self.params),
              **self.dp.state(), "ip": self.ip, "mac": self.mac,
              "control_port": self.control_port, "started": self.started,
              "lease_s": self.lease_s, "job_slots": self.job_slots,
              "require_token": self.require_token, "auth": self.auth,
              "capacity_bps": self.capacity_bps,
              # the policy between jobs: `status` then asks the daemon for their parts
              "shares": self.table.shares.info() if self.table and self.table.shares else None,
              "netns_inode": netns_inode(),
              "tree": self.link.describe() if self.link else None,
              "jobs": self.table.describe() if self.table else []}
        self._wrote_state = True
        write_state(self.iface, st, self.table.token_hashes() if self.table else {})

    def status_extra(self) -> dict:
        """What `status` adds to the jobs: counters and the data plane (no secrets)."""
        ports = self.dp.maps.read_port_stats(len(self.dp.ports))
        return {"counters": self.dp.maps.read_counters(), "job_stats": read_job_stats(self.dp.maps),
                "port_stats": [{"port": p, **row} for p, row in zip(self.dp.ports, ports)],
                "dataplane": self.dp.name,
                "shares": self.table.shares.info() if self.table.shares else None,
                "mode": self.dp.mode, "params": asdict(self.params),
                "tree": self.link.describe() if self.link else None, **self.dp.status_extra()}

    # --- serving ---------------------------------------------------------------
    async def serve(self, ready_cb=None, metrics: tuple[str, int] | None = None) -> None:
        """metrics: (address, port) of a Prometheus endpoint to serve too (metrics.py)."""
        self.server = ControlServer(self.table, self.switch_info(), self.lease_s,
                                    lambda: {"require_token": self.require_token, **self.status_extra()},
                                    parent=self.link)
        self.server.operator_token = self.operator_token
        try:
            await self.server.start(self.ip, self.control_port)
        except OSError as e:
            raise SwitchError(f"cannot listen on {self.ip}:{self.control_port}: {e.strerror}") from None
        exporter = await self._start_metrics(metrics) if metrics else None
        keeper = (asyncio.create_task(keep_shares(self.table.shares, self.table))
                  if self.table.shares else None)
        try:
            await self._serve_until_stopped(ready_cb)
        finally:
            if keeper is not None:
                keeper.cancel()
            if exporter is not None:
                await exporter.close()

    async def _start_metrics(self, listen: tuple[str, int]) -> MetricsServer:
        """The Prometheus endpoint, on this event loop (snapshots are taken on it)."""
        try:
            exporter = MetricsServer(SwitchCollector(self.server.status_reply, self.iface))
            await exporter.start(*listen)
        except MetricsError as e:
            raise SwitchError(str(e)) from None
        return exporter

    async def _serve_until_stopped(self, ready_cb) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready_cb:
            ready_cb()
        await stop.wait()
        await self.server.stop("the switch is shutting down")
        await asyncio.sleep(0.05)  # let the abort events reach the workers


def run(dataplane: Dataplane, control_port: int, job_slots: int = DEFAULT_JOB_SLOTS,
        lease_s: float = DEFAULT_LEASE_S, require_token: bool = False,
        initial_seq: int = 0, metrics: tuple[str, int] | None = None,
        auth: str = "header", capacity_bps: int | None = None,
        parent: tuple[str, int] | None = None, share: ShareConfig | None = None) -> dict[str, int]:
    """Serve until SIGINT/SIGTERM; returns the data plane's final counters.
    metrics: (address, port) of a Prometheus endpoint to serve as well;
    parent: a rack box's parent box (address, control port)."""
    t0 = time.monotonic()
    sw = Switch(dataplane, control_port, job_slots, lease_s, require_token, initial_seq, auth,
                capacity_bps, parent, share)
    iface, params = sw.iface, sw.params
    try:
        sw.load()
    except DataplaneError as e:
        sw.unload()
        raise SwitchError(str(e)) from None
    except BaseException:
        sw.unload()
        raise

    def ready():
        print(f"swml-switch: up on {iface} ({dataplane.label}, k={params.k}, {params.slots} slots, "
              f"fanout {dataplane.fanout}, RESULTs authenticated over the {auth}"
              f"{'' if auth == 'header' else ' and payload'}, "
              f"data {sw.ip}:{params.port}, control {sw.ip}:{control_port}"
              + (f", metrics http://{metrics[0]}:{metrics[1]}/metrics" if metrics else "")
              + (f", below the parent box {parent[0]} through {dataplane.uplink} "
                 f"({sw.link.port.ip})" if parent else "")
              + (f", shares {share.policy} of {sw.capacity_bps / 1e6:g} Mbit/s" if share else "")
              + f") in {time.monotonic() - t0:.2f} s", flush=True)

    try:
        asyncio.run(sw.serve(ready, metrics))
    finally:
        counters = sw.unload()
        print(f"swml-switch: {iface} detached; counters "
              f"{ {k: v for k, v in counters.items() if v} }", file=sys.stderr, flush=True)
    return counters


def down(iface: str, timeout_s: float = 10.0) -> str:
    """Stop the switch on an interface: signal its daemon, then make sure what
    its data plane left (an XDP program, pins) and the state file are gone.
    Returns what it did; SwitchError says what it could not do."""
    if os.geteuid() != 0:
        raise SwitchError("swml-switch down needs root (it stops the daemon, detaches XDP "
                          "and removes pinned maps)")
    st = read_state(iface)
    kind = DATAPLANES.get(st["dataplane"], XdpDataplane) if st else XdpDataplane
    # The lock names the live daemon; a dead one's pid in the state file may
    # belong to another process by now.
    pid = lock_holder(iface)
    if st is None and pid is None and not kind.left_behind(iface):
        raise SwitchError(f"swml-switch is not up on {iface}")
    did = []
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while lock_holder(iface) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        if lock_holder(iface) is not None:
            raise SwitchError(f"the daemon (pid {pid}) on {iface} did not stop within "
                              f"{timeout_s:g} s of SIGTERM; nothing else was done")
        did.append(f"stopped daemon pid {pid}")
    removed, failed = kind.remove_leftovers(iface, st)
    did += removed
    if failed:
        raise SwitchError("; ".join(did + [f"could not finish: {'; '.join(failed)}"]))
    if remove_state(iface):   # else the daemon removed it as it stopped
        did.append("removed the state file")
    return ", ".join(did) or "nothing was left to clean"
