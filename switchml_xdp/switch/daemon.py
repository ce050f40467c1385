"""`swml-switch up`: open a data plane on an interface and serve the control
protocol in the foreground until Ctrl-C / SIGTERM, then stop cleanly. One
daemon and one serve loop, whichever data plane (dataplane.py) it drives.

What another shell needs to find a running switch is a small state file
(/run/swml/IFACE.json: data plane, parameters, pid, jobs; readable by anyone,
no secrets) rewritten on every change, and for the XDP data plane its pinned
maps (/sys/fs/bpf/swml/IFACE/). The digests of running jobs' tokens, which a
daemon that re-adopts them needs, are in IFACE.tokens.json, root's alone.

One daemon an interface, whatever the timing: `up` takes an exclusive flock
on /run/swml/IFACE.lock before it touches anything, and holds it for its
life (the kernel releases it when the process dies, even by SIGKILL).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import struct
import sys
import time
from dataclasses import asdict

from .. import net, wire
from .control import ControlServer
from .dataplane import DEFAULT_FANOUT, Dataplane, DataplaneError, SwitchParams, netns_inode
from .jobs import JobTable
from .metrics import MetricsError, MetricsServer, SwitchCollector
from .userspace import UserspaceDataplane
from .xdp_dataplane import XdpDataplane

STATE_DIR = "/run/swml"
DEFAULT_JOB_SLOTS = 128
DEFAULT_LEASE_S = 3.0
DATAPLANES: dict[str, type[Dataplane]] = {"xdp": XdpDataplane, "userspace": UserspaceDataplane}

log = logging.getLogger("swml.switch")


class SwitchError(RuntimeError):
    """A reason `up` or `down` cannot proceed, for the user in one line."""


def make_dataplane(name: str, iface: str, params: SwitchParams, mode: str | None = None,
                   fanout: str | None = None) -> Dataplane:
    """The data plane called `name` (a key of DATAPLANES); `mode` and a
    unicast `fanout` are XDP's only."""
    try:
        if name == "xdp":
            return XdpDataplane(iface, params, mode, fanout)
        if mode is not None:
            raise SwitchError(f"--mode is the XDP data plane's (native or generic); "
                              f"the {name} data plane has none")
        if fanout not in (None, DEFAULT_FANOUT):
            raise SwitchError(f"--fanout {fanout} needs the xdp data plane; the {name} data "
                              f"plane sends RESULTs by {DEFAULT_FANOUT} only")
        return DATAPLANES[name](iface, params)
    except DataplaneError as e:
        raise SwitchError(str(e)) from None


def read_job_stats(maps) -> dict[str, dict[str, int]] | None:
    """Per job id (as text, as JSON has it) its cumulative packets, bytes,
    results and shadow replies, where the data plane counts them
    (`DataplaneMaps.read_job_stats`); None where it does not."""
    read = getattr(maps, "read_job_stats", None)
    if read is None:
        return None
    return {str(job_id): dict(stats) for job_id, stats in read().items()}


def state_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.json"


def tokens_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.tokens.json"


def lock_path(iface: str) -> str:
    return f"{STATE_DIR}/{iface}.lock"


def remove_leftover_files(iface: str) -> bool:
    """Remove the state, token and lock files a daemon left for `iface`, unless a
    daemon holds its lock now; returns whether they were removed. (A daemon
    leaves its lock file on purpose: unlinking a lock another process waits on
    would let two daemons in. Whoever retires an interface for good, the lab
    for one, calls this.)"""
    if lock_holder(iface) is not None:
        return False
    for path in (state_path(iface), tokens_path(iface), lock_path(iface)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def take_lock(iface: str) -> int:
    """The interface's lock, held until the returned fd is closed (or the
    process dies); SwitchError if another daemon holds it. A POSIX record
    lock, so that others can ask who holds it without taking it (F_GETLK)."""
    os.makedirs(STATE_DIR, exist_ok=True)
    try:
        fd = os.open(lock_path(iface), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise SwitchError(f"cannot open {lock_path(iface)}: {e.strerror}") from None
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            raise SwitchError(f"cannot lock {lock_path(iface)}: {e.strerror}") from None
        holder = lock_holder(iface)
        raise SwitchError(f"swml-switch is already up on {iface}"
                          + (f" (pid {holder})" if holder else "")
                          + f"; `swml-switch down {iface}` first") from None
    return fd


_FLOCK = struct.Struct("hhxxxxqqixxxx")   # struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid)


def lock_holder(iface: str) -> int | None:
    """The pid of the daemon holding the interface's lock (as this process's
    pid namespace sees it); None if nobody holds it. Takes no lock itself."""
    try:
        fd = os.open(lock_path(iface), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    finally:
        os.close(fd)
    l_type, _, _, _, pid = _FLOCK.unpack(got)
    return None if l_type == fcntl.F_UNLCK else (pid or None)


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
        if name.endswith(".json") and not name.startswith("lab-") and not name.endswith(".tokens.json"):
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
                 job_slots: int = DEFAULT_JOB_SLOTS, lease_s: float = DEFAULT_LEASE_S,
                 require_token: bool = False, initial_seq: int = 0):
        self.dp, self.iface, self.params = dataplane, dataplane.iface, dataplane.params
        self.control_port, self.job_slots, self.lease_s = control_port, job_slots, lease_s
        self.require_token, self.initial_seq = require_token, initial_seq
        self._lock_fd: int | None = None
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
        # Before anything is loaded: a second `up`, however close behind, stops here.
        self._lock_fd = take_lock(self.iface)
        st = read_state(self.iface)
        self.dp.check_free(st)
        adopt = self._adoptable(st)
        if adopt and adopt.get("mode") == "generic" and getattr(self.dp, "requested_mode", "") is None:
            print(f"swml-switch: {self.iface}: taking over the previous switch, in its generic XDP "
                  f"mode, so that its jobs go on; for native XDP, `swml-switch down {self.iface}` "
                  f"first", file=sys.stderr, flush=True)
        maps = self.dp.open(self.ip, adopt)
        self.table = JobTable(maps, self.params.k, self.params.slots, self.job_slots,
                              on_change=self.write_state, require_token=self.require_token,
                              initial_seq=self.initial_seq)
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
        active = {j["id"] for j in running}
        for job_id in range(1, wire.MAX_JOBS):  # joins the old daemon never finished
            if job_id not in active and self.dp.maps.job_active(job_id):
                self.dp.maps.clear_job(job_id, wire.MAX_WORLD)
        try:
            with open(tokens_path(self.iface)) as f:
                digests = json.load(f)
        except (OSError, ValueError):
            digests = {}
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
        if self._wrote_state:
            for path in (state_path(self.iface), tokens_path(self.iface)):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        os.close(self._lock_fd)   # the next `up` may start
        self._lock_fd = None
        return counters

    def switch_info(self) -> dict:
        """What joiners are told of the switch (and `status` shows)."""
        return {"iface": self.iface, "ip": self.ip, "mac": self.mac, "port": self.params.port,
                "fanout": self.dp.fanout}

    def write_state(self) -> None:
        os.makedirs(STATE_DIR, exist_ok=True)
        st = {"iface": self.iface, "pid": os.getpid(), "params": asdict(self.params),
              **self.dp.state(), "ip": self.ip, "mac": self.mac,
              "control_port": self.control_port, "started": self.started,
              "lease_s": self.lease_s, "job_slots": self.job_slots,
              "require_token": self.require_token, "netns_inode": netns_inode(),
              "jobs": self.table.describe() if self.table else []}
        self._wrote_state = True
        _write_json(tokens_path(self.iface), self.table.token_hashes() if self.table else {}, 0o600)
        _write_json(state_path(self.iface), st, 0o644)

    def status_extra(self) -> dict:
        """What `status` adds to the jobs: counters and the data plane (no secrets)."""
        return {"counters": self.dp.maps.read_counters(), "job_stats": read_job_stats(self.dp.maps),
                "dataplane": self.dp.name,
                "mode": self.dp.mode, "params": asdict(self.params), **self.dp.status_extra()}

    # --- serving ---------------------------------------------------------------
    async def serve(self, ready_cb=None, metrics: tuple[str, int] | None = None) -> None:
        """metrics: (address, port) of a Prometheus endpoint to serve too (metrics.py)."""
        self.server = ControlServer(self.table, self.switch_info(), self.lease_s,
                                    lambda: {"require_token": self.require_token, **self.status_extra()})
        try:
            await self.server.start(self.ip, self.control_port)
        except OSError as e:
            raise SwitchError(f"cannot listen on {self.ip}:{self.control_port}: {e.strerror}") from None
        exporter = self._start_metrics(metrics) if metrics else None
        try:
            await self._serve_until_stopped(ready_cb)
        finally:
            if exporter is not None:
                exporter.close()

    def _start_metrics(self, listen: tuple[str, int]) -> MetricsServer:
        loop = asyncio.get_running_loop()

        async def on_loop() -> dict:
            return self.server.status_reply()

        def snapshot() -> dict:   # in the HTTP server's thread
            return asyncio.run_coroutine_threadsafe(on_loop(), loop).result(timeout=10)

        try:
            return MetricsServer(SwitchCollector(snapshot, self.iface), *listen)
        except MetricsError as e:
            raise SwitchError(str(e)) from None

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


def _write_json(path: str, obj, mode: int) -> None:
    """Replace `path` atomically with a file of that mode (never briefly wider)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    os.fchmod(fd, mode)   # also when the file was left by an earlier daemon
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def run(dataplane: Dataplane, control_port: int, job_slots: int = DEFAULT_JOB_SLOTS,
        lease_s: float = DEFAULT_LEASE_S, require_token: bool = False,
        initial_seq: int = 0, metrics: tuple[str, int] | None = None) -> dict[str, int]:
    """Serve until SIGINT/SIGTERM; returns the data plane's final counters.
    metrics: (address, port) of a Prometheus endpoint to serve as well."""
    t0 = time.monotonic()
    sw = Switch(dataplane, control_port, job_slots, lease_s, require_token, initial_seq)
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
              f"fanout {dataplane.fanout}, "
              f"data {sw.ip}:{params.port}, control {sw.ip}:{control_port}"
              + (f", metrics http://{metrics[0]}:{metrics[1]}/metrics" if metrics else "")
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
    for path in (state_path(iface), tokens_path(iface)):
        try:
            os.unlink(path)
            if path == state_path(iface):
                did.append("removed the state file")
        except FileNotFoundError:
            pass  # the daemon removed it as it stopped
    return ", ".join(did) or "nothing was left to clean"
