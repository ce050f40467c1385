"""`swml-switch up`: load the data plane on an interface and serve the control
protocol in the foreground until Ctrl-C / SIGTERM, then detach cleanly.

What another shell needs to find a running switch lives in two places: the
pinned maps (/sys/fs/bpf/swml/IFACE/) and a small state file
(/run/swml/IFACE.json: parameters, pid, jobs) rewritten on every change.
"""
from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict

from pyroute2 import IPRoute

from ..bpf import xdp_attach
from . import dataplane
from .control import ControlServer
from .dataplane import DataplaneError, SwitchParams
from .jobs import JobTable
from .maps import SwitchMaps

STATE_DIR = "/run/swml"
DEFAULT_JOB_SLOTS = 128
DEFAULT_LEASE_S = 3.0

log = logging.getLogger("swml.switch")


class SwitchError(RuntimeError):
    """A reason `up` or `down` cannot proceed, for the user in one line."""


def state_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.json"


def read_state(iface: str) -> dict | None:
    try:
        with open(state_path(iface)) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def all_states() -> list[dict]:
    if not os.path.isdir(STATE_DIR):
        return []
    out = []
    for name in sorted(os.listdir(STATE_DIR)):
        if name.endswith(".json") and not name.startswith("lab-"):
            st = read_state(name[:-5])
            if st and "iface" in st:
                out.append(st)
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as e:
        return e.errno == errno.EPERM
    return True


def iface_address(iface: str) -> tuple[str, str]:
    """(IPv4, MAC) of an interface in this network namespace."""
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=iface)
        if not idx:
            raise SwitchError(f"no interface named {iface!r} in this network namespace")
        link = ipr.get_links(idx[0])[0]
        addrs = ipr.get_addr(index=idx[0], family=2)
    if not addrs:
        raise SwitchError(f"{iface} has no IPv4 address; the switch answers on its address")
    return addrs[0].get_attr("IFA_ADDRESS"), link.get_attr("IFLA_ADDRESS")


def check_free(iface: str) -> None:
    """Refuse an interface that another switch or another XDP program holds."""
    st = read_state(iface)
    if st and pid_alive(st.get("pid", -1)) and st.get("pid") != os.getpid():
        raise SwitchError(f"swml-switch is already up on {iface} (pid {st['pid']}); "
                          f"`swml-switch down {iface}` first")
    att = xdp_attach.attachment(iface)
    if att.mode is not None and not (st and st.get("prog_id") == att.prog_id):
        raise SwitchError(f"{iface} already has an XDP program attached (id {att.prog_id}, {att.mode}) "
                          f"that is not this switch's; detach it first (`ip link set {iface} xdp off`)")


class Switch:
    """One switch on one interface: data plane + job table + control server."""

    def __init__(self, iface: str, params: SwitchParams, control_port: int, mode: str | None,
                 job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S):
        self.iface, self.params, self.control_port = iface, params, control_port
        self.requested_mode, self.job_slots, self.lease_s = mode, job_slots, lease_s
        self.mode = None
        self.prog_id = 0
        self.maps: SwitchMaps | None = None
        self.table: JobTable | None = None
        self.server: ControlServer | None = None
        self.started = time.time()
        self.ip = self.mac = None

    # --- bring-up and tear-down ------------------------------------------
    def load(self) -> None:
        if os.geteuid() != 0:
            raise SwitchError("swml-switch up needs root (XDP, bpffs)")
        if not 1 <= self.control_port <= 65535:
            raise SwitchError(f"--control-port must be in 1..65535, got {self.control_port}")
        self.ip, self.mac = iface_address(self.iface)
        check_free(self.iface)
        adopt = self._adoptable_state()
        if SwitchMaps.exist(self.iface) and adopt is None:
            dataplane.remove_pins(self.iface)  # stale: from another configuration or a clean stop
        self._bpf, fn = dataplane.compile_switch(self.iface, self.params)
        self.maps = SwitchMaps(self.iface, self.params.k)
        self.table = JobTable(self.maps, self.params.k, self.params.slots, self.job_slots,
                              on_change=self.write_state)
        if adopt is not None:
            self._adopt(adopt)
        # Replacing the program in one netlink call: the data plane never stops.
        self.mode = dataplane.attach_switch(self.iface, fn.fd, self.requested_mode or
                                            (adopt or {}).get("mode"), replace=True)
        self.prog_id = xdp_attach.attachment(self.iface).prog_id
        self.write_state()

    def _adoptable_state(self) -> dict | None:
        """The state of a daemon that died while its data plane kept running on
        this interface with the same parameters: its jobs can be taken over."""
        st = read_state(self.iface)
        if not st or pid_alive(st.get("pid", -1)) or not SwitchMaps.exist(self.iface):
            return None
        if xdp_attach.attachment(self.iface).prog_id != st.get("prog_id"):
            return None
        if st.get("params") != asdict(self.params):
            if st.get("jobs"):
                print(f"swml-switch: the previous switch on {self.iface} ran with {st['params']}; "
                      f"its {len(st['jobs'])} job(s) are discarded", file=sys.stderr)
            return None
        return st

    def _adopt(self, st: dict) -> None:
        running = [j for j in st.get("jobs", []) if j["state"] == "running"]
        active = {j["id"] for j in running}
        for job_id in range(1, 256):  # joins the old daemon never finished
            if job_id not in active and self.maps.read_job(job_id).active:
                self.maps.clear_job(job_id, 64)
        for desc in running:
            self.table.adopt(desc)
        print(f"swml-switch: re-adopted {len(running)} running job(s) of the previous daemon "
              f"(pid {st['pid']}) on {self.iface}; their workers have {self.lease_s:g} s to resume",
              file=sys.stderr, flush=True)

    def unload(self) -> None:
        try:
            if xdp_attach.attachment(self.iface).prog_id == self.prog_id:
                xdp_attach.detach(self.iface)
        except xdp_attach.XdpError as e:
            log.warning("%s", e)
        if self.maps:
            self.maps.close()
        dataplane.remove_pins(self.iface)
        try:
            os.unlink(state_path(self.iface))
        except FileNotFoundError:
            pass

    def switch_info(self) -> dict:
        return {"iface": self.iface, "ip": self.ip, "mac": self.mac, "port": self.params.port}

    def write_state(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        st = {"iface": self.iface, "pid": os.getpid(), "params": asdict(self.params),
              "mode": self.mode, "prog_id": self.prog_id, "ip": self.ip, "mac": self.mac,
              "control_port": self.control_port, "started": self.started,
              "lease_s": self.lease_s, "job_slots": self.job_slots,
              "jobs": self.table.describe() if self.table else []}
        tmp = state_path(self.iface) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f, indent=1)
        os.replace(tmp, state_path(self.iface))

    def status_extra(self) -> dict:
        return {"counters": self.maps.read_counters(), "mode": self.mode,
                "params": asdict(self.params)}

    # --- serving ---------------------------------------------------------------
    async def serve(self, ready_cb=None) -> None:
        self.server = ControlServer(self.table, self.switch_info(), self.lease_s, self.status_extra)
        try:
            await self.server.start(self.ip, self.control_port)
        except OSError as e:
            raise SwitchError(f"cannot listen on {self.ip}:{self.control_port}: {e.strerror}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if ready_cb:
            ready_cb()
        await stop.wait()
        await self.server.stop("the switch is shutting down")
        await asyncio.sleep(0.05)  # let the abort events reach the workers


def run(iface: str, params: SwitchParams, control_port: int, mode: str | None,
        job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S) -> None:
    t0 = time.monotonic()
    sw = Switch(iface, params, control_port, mode, job_slots, lease_s)
    try:
        sw.load()
    except (DataplaneError, xdp_attach.XdpError) as e:
        sw.unload() if sw.prog_id else None
        raise SwitchError(str(e)) from None

    def ready():
        print(f"swml-switch: up on {iface} ({sw.mode} XDP, k={params.k}, {params.slots} slots, "
              f"data {sw.ip}:{params.port}, control {sw.ip}:{control_port}) "
              f"in {time.monotonic() - t0:.2f} s", flush=True)

    try:
        asyncio.run(sw.serve(ready))
    finally:
        sw.unload()
        print(f"swml-switch: {iface} detached", file=sys.stderr, flush=True)


def down(iface: str, timeout_s: float = 10.0) -> str:
    """Stop the switch on an interface: signal its daemon, then make sure the
    program is detached and the pins and state are gone. Returns what it did."""
    st = read_state(iface)
    if st is None and not SwitchMaps.exist(iface):
        raise SwitchError(f"swml-switch is not up on {iface}")
    did = []
    pid = st.get("pid") if st else None
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        did.append(f"stopped daemon pid {pid}")
    try:
        att = xdp_attach.attachment(iface)
        if att.mode is not None and (st is None or att.prog_id == st.get("prog_id")):
            xdp_attach.detach(iface)
            did.append("detached XDP")
    except xdp_attach.XdpError:
        pass  # the interface is gone (e.g. a lab namespace was removed)
    if SwitchMaps.exist(iface):
        dataplane.remove_pins(iface)
        did.append("removed pinned maps")
    try:
        os.unlink(state_path(iface))
    except FileNotFoundError:
        pass
    return ", ".join(did) or "nothing was left to clean"
