"""`swml-switch up`: open a data plane on an interface and serve the control
protocol in the foreground until Ctrl-C / SIGTERM, then stop cleanly. One
daemon and one serve loop, whichever data plane (dataplane.py) it drives.

What another shell needs to find a running switch is a small state file
(/run/swml/IFACE.json: data plane, parameters, pid, jobs) rewritten on every
change, and for the XDP data plane its pinned maps (/sys/fs/bpf/swml/IFACE/).
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

from .. import net, wire
from .control import ControlServer
from .dataplane import Dataplane, DataplaneError, SwitchParams
from .jobs import JobTable
from .userspace import UserspaceDataplane
from .xdp_dataplane import XdpDataplane

STATE_DIR = "/run/swml"
DEFAULT_JOB_SLOTS = 128
DEFAULT_LEASE_S = 3.0
DATAPLANES: dict[str, type[Dataplane]] = {"xdp": XdpDataplane, "userspace": UserspaceDataplane}

log = logging.getLogger("swml.switch")


class SwitchError(RuntimeError):
    """A reason `up` or `down` cannot proceed, for the user in one line."""


def make_dataplane(name: str, iface: str, params: SwitchParams, mode: str | None = None) -> Dataplane:
    """The data plane called `name` (a key of DATAPLANES); `mode` is XDP's only."""
    try:
        if name == "xdp":
            return XdpDataplane(iface, params, mode)
        if mode is not None:
            raise SwitchError(f"--mode is the XDP data plane's (native or generic); "
                              f"the {name} data plane has none")
        return DATAPLANES[name](iface, params)
    except DataplaneError as e:
        raise SwitchError(str(e)) from None


def state_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.json"


def read_state(iface: str) -> dict | None:
    try:
        with open(state_path(iface)) as f:
            st = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if "dataplane" not in st:  # written by a daemon older than the choice: an XDP one
        st.update(dataplane="xdp", label=f"{st.get('mode')} XDP")
    return st


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
    try:
        mac = net.link_mac(iface)
    except net.NetError as e:
        raise SwitchError(str(e)) from None
    try:
        return net.link_ipv4(iface), mac
    except net.NetError as e:
        raise SwitchError(f"{e}; the switch answers on its address") from None


class Switch:
    """One switch on one interface: data plane + job table + control server."""

    def __init__(self, dataplane: Dataplane, control_port: int,
                 job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S):
        self.dp, self.iface, self.params = dataplane, dataplane.iface, dataplane.params
        self.control_port, self.job_slots, self.lease_s = control_port, job_slots, lease_s
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
        self.ip, self.mac = iface_address(self.iface)
        st = read_state(self.iface)
        if st and pid_alive(st.get("pid", -1)) and st.get("pid") != os.getpid():
            raise SwitchError(f"swml-switch is already up on {self.iface} (pid {st['pid']}); "
                              f"`swml-switch down {self.iface}` first")
        self.dp.check_free(st)
        adopt = self._adoptable(st)
        maps = self.dp.open(self.ip, adopt)
        self.table = JobTable(maps, self.params.k, self.params.slots, self.job_slots,
                              on_change=self.write_state)
        if adopt is not None:
            self._adopt(adopt)
        self.dp.start(adopt)
        self.write_state()

    def _adoptable(self, st: dict | None) -> dict | None:
        """The state of a daemon that died while its data plane kept running on
        this interface with the same parameters: its jobs can be taken over."""
        if (not st or pid_alive(st.get("pid", -1)) or st.get("dataplane") != self.dp.name
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
        active = {j["id"] for j in running}
        for job_id in range(1, wire.MAX_JOBS):  # joins the old daemon never finished
            if job_id not in active and self.dp.maps.job_active(job_id):
                self.dp.maps.clear_job(job_id, wire.MAX_WORLD)
        for desc in running:
            self.table.adopt(desc)
        print(f"swml-switch: re-adopted {len(running)} running job(s) of the previous daemon "
              f"(pid {st['pid']}) on {self.iface}; their workers have {self.lease_s:g} s to resume",
              file=sys.stderr, flush=True)

    def unload(self) -> dict[str, int]:
        """Stop the data plane, remove the state file; returns the final counters."""
        counters = self.dp.maps.read_counters() if self.dp.maps is not None else {}
        self.dp.close()
        if self._wrote_state:
            try:
                os.unlink(state_path(self.iface))
            except FileNotFoundError:
                pass
        return counters

    def switch_info(self) -> dict:
        return {"iface": self.iface, "ip": self.ip, "mac": self.mac, "port": self.params.port}

    def write_state(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        st = {"iface": self.iface, "pid": os.getpid(), "params": asdict(self.params),
              **self.dp.state(), "ip": self.ip, "mac": self.mac,
              "control_port": self.control_port, "started": self.started,
              "lease_s": self.lease_s, "job_slots": self.job_slots,
              "jobs": self.table.describe() if self.table else []}
        tmp = state_path(self.iface) + ".tmp"
        with open(tmp, "w") as f:
            json.dump(st, f, indent=1)
        os.replace(tmp, state_path(self.iface))
        self._wrote_state = True

    def status_extra(self) -> dict:
        return {"counters": self.dp.maps.read_counters(), "dataplane": self.dp.name,
                "mode": self.dp.mode, "params": asdict(self.params), **self.dp.status_extra()}

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


def run(dataplane: Dataplane, control_port: int, job_slots: int = DEFAULT_JOB_SLOTS,
        lease_s: float = DEFAULT_LEASE_S) -> dict[str, int]:
    """Serve until SIGINT/SIGTERM; returns the data plane's final counters."""
    t0 = time.monotonic()
    sw = Switch(dataplane, control_port, job_slots, lease_s)
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
              f"data {sw.ip}:{params.port}, control {sw.ip}:{control_port}) "
              f"in {time.monotonic() - t0:.2f} s", flush=True)

    try:
        asyncio.run(sw.serve(ready))
    finally:
        counters = sw.unload()
        print(f"swml-switch: {iface} detached; counters "
              f"{ {k: v for k, v in counters.items() if v} }", file=sys.stderr, flush=True)
    return counters


def down(iface: str, timeout_s: float = 10.0) -> str:
    """Stop the switch on an interface: signal its daemon, then make sure what
    its data plane left (an XDP program, pins) and the state file are gone.
    Returns what it did."""
    st = read_state(iface)
    kind = DATAPLANES.get(st["dataplane"], XdpDataplane) if st else XdpDataplane
    if st is None and not kind.left_behind(iface):
        raise SwitchError(f"swml-switch is not up on {iface}")
    did = []
    pid = st.get("pid") if st else None
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        did.append(f"stopped daemon pid {pid}")
    did += kind.remove_leftovers(iface, st)
    try:
        os.unlink(state_path(iface))
        did.append("removed the state file")
    except FileNotFoundError:
        pass  # the daemon removed it as it stopped
    return ", ".join(did) or "nothing was left to clean"
