"""An emulated cluster on one machine: a switch and N workers on a Linux bridge.

    {p}-sw: {p}-s 10.0.0.1 ──veth── {p}-bs ┐
    {p}-w0: {p}-w0 10.0.0.11 ─veth─ {p}-b0 ├─ {p}-br0 (bridge, in ns {p}-br)
    {p}-w1: {p}-w1 10.0.0.12 ─veth─ {p}-b1 ┘

Every name carries a per-run prefix {p} ("swl" + 5 hex digits unless given),
so concurrent labs (parallel test runs, a lab left up by `swml-lab up`) never
collide, and everything a lab made can be found and removed by prefix, also
after the process that made it died.

Bridge-side veth ends carry an XDP pass program: see xdp/swml_pass.c for why
veth needs one. Optional shaping (rate_mbit) gives every worker link the same
rate in each direction, for every kind of traffic (see `Lab._shape_worker_links`
and docs/design-decisions.md, "Lab"). Optional loss and duplication per link
and direction replace the pass program with the loss injector
(xdp/swml_loss.c, switchml_xdp/lab/loss.py).
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import ipaddress
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from pyroute2 import IPRoute

from switchml_xdp.cheaders import xdp_dir
from switchml_xdp.lab import netns

log = logging.getLogger(__name__)

PREFIX_STEM = "swl"          # default prefixes start with it; `down --all` removes "swl*"
IFNAMSIZ = 15                # longest interface name Linux accepts
SUBNET_PREFIXLEN = 24
SWITCH_IP = "10.0.0.1"
WORKER_IP_BASE = 11          # worker i is 10.0.0.{11+i}
MAX_WORKERS = 254 - WORKER_IP_BASE + 1
MAX_RATE_MBIT = 34_000       # TBF's rate is a u32 in bytes/s (pyroute2 has no rate64)
STATE_DIR = Path("/run/swml")
PASS_SOURCE = "lab/swml_pass.c"
XDP_ATTACHED_DRV = "xdp"     # pyroute2's name for IFLA_XDP_ATTACHED == XDP_ATTACHED_DRV

_PREFIX_RE = re.compile(r"[A-Za-z0-9_]+")


class LabError(RuntimeError):
    """A lab could not be built or found; the message is one line for the user."""


@dataclasses.dataclass(frozen=True)
class Host:
    """One end host of the lab: the switch ("sw") or a worker ("w0", "w1", ...).

    `iface` is the host's veth end inside `ns`; `peer` is the other end, in the
    bridge namespace (where the loss injector and the pass program attach).
    """
    name: str
    ns: str
    iface: str
    ip: str
    mac: str
    peer: str


def new_prefix() -> str:
    """A fresh per-run prefix, e.g. "swl3fa2c"."""
    return PREFIX_STEM + secrets.token_hex(3)[:5]


def state_path(prefix: str) -> Path:
    """Where a lab describes itself (hosts, owner) for the CLI and for cleanup."""
    return STATE_DIR / f"lab-{prefix}.json"


def _mac(side: int, group: int, index: int) -> str:
    """Locally administered, readable MACs: 02:5d:00:<side>:<group>:<index>.

    side 0 = host end, 1 = bridge end; group 0 = switch/bridge, 1 = workers.
    """
    return f"02:5d:00:{side:02x}:{group:02x}:{index:02x}"


def _switch_host(prefix: str) -> Host:
    return Host("sw", f"{prefix}-sw", f"{prefix}-s", SWITCH_IP, _mac(0, 0, 1), f"{prefix}-bs")


def _worker_host(prefix: str, i: int) -> Host:
    name = f"w{i}"
    return Host(name, f"{prefix}-{name}", f"{prefix}-{name}",
                f"10.0.0.{WORKER_IP_BASE + i}", _mac(0, 1, i), f"{prefix}-b{i}")


def _check_args(workers: int, prefix: str, rate_mbit: float | None) -> None:
    """Reject what would fail half-way through the build, with a one-line reason."""
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise LabError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {workers!r}")
    if not _PREFIX_RE.fullmatch(prefix):
        raise LabError(f"prefix {prefix!r} may hold only letters, digits and '_'")
    longest = max(f"{prefix}-br0", f"{prefix}-w{workers - 1}", f"{prefix}-b{workers - 1}", key=len)
    if len(longest) > IFNAMSIZ:
        raise LabError(f"prefix {prefix!r} too long: interface {longest!r} would exceed "
                       f"{IFNAMSIZ} characters")
    if rate_mbit is not None and not 0 < rate_mbit <= MAX_RATE_MBIT:
        raise LabError(f"rate must be in (0, {MAX_RATE_MBIT}] Mbit/s, not {rate_mbit!r}")


# ---------------------------------------------------------------- netlink helpers

def _index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise LabError(f"interface {ifname} not found")
    return found[0]


def attach_xdp(ipr: IPRoute, ifname: str, prog_fd: int) -> None:
    """Attach an XDP program in native (driver) mode, and check that it is.

    pyroute2 0.7 encodes IFLA_XDP_FLAGS as a big-endian u16 the kernel does not
    read as intended, so no mode flag is sent: without one the kernel uses
    driver mode whenever the driver implements it (veth does) and falls back to
    generic otherwise. Reading IFLA_XDP_ATTACHED back turns that silent
    fallback into an error.
    """
    index = _index(ipr, ifname)
    ipr.link("set", index=index, xdp_fd=prog_fd)
    xdp = ipr.get_links(index)[0].get_attr("IFLA_XDP")
    mode = xdp.get_attr("IFLA_XDP_ATTACHED") if xdp is not None else None
    if mode != XDP_ATTACHED_DRV:
        raise LabError(f"XDP program on {ifname} attached in mode {mode!r}, not native")


def _burst(rate: int) -> int:
    """Bucket size for `rate` bytes/s: at least 1 ms of traffic, at least 32 KiB."""
    return max(32 * 1024, rate // 1000)


def shape(ipr: IPRoute, ifname: str, rate_mbit: float) -> None:
    """Limit what `ifname` sends to rate_mbit with a TBF root qdisc.

    A qdisc only sees frames that go through the stack's transmit path
    (dev_queue_xmit): kernel sockets, and everything a bridge forwards. Frames
    an AF_XDP socket sends in copy mode (__dev_direct_xmit) and frames an XDP
    program sends with XDP_TX skip the qdisc of the interface they leave by.
    """
    rate = int(rate_mbit * 1_000_000 / 8)               # bytes/s
    ipr.tc("add", "tbf", _index(ipr, ifname), 0x10000, rate=rate, burst=_burst(rate),
           latency="20ms")


HTB_HANDLE = 0x10000          # 1:
HTB_CLASS_BASE = 0x10                                   # class 1:(10+i) for source i


def shape_per_source(ipr: IPRoute, ifname: str, rate_mbit: float, sources: Sequence[str]) -> None:
    """Limit what `ifname` sends from each IPv4 source in `sources` to
    rate_mbit, independently: an HTB root qdisc with one class per source
    (1:10, 1:11, ...; rate = ceil, no borrowing), chosen by a u32 filter on the
    IPv4 source address. Anything else (ARP, other sources) matches no class and
    goes through HTB's direct queue, unshaped, so the port is never a
    bottleneck of its own."""
    rate = int(rate_mbit * 1_000_000 / 8)
    idx = _index(ipr, ifname)
    ipr.tc("add", "htb", idx, HTB_HANDLE, default=0)     # 0: unclassified -> direct queue
    quantum = max(1600, min(200_000, rate // 10))
    for i, ip in enumerate(sources):
        classid = HTB_HANDLE | (HTB_CLASS_BASE + i)
        ipr.tc("add-class", "htb", idx, classid, parent=HTB_HANDLE, rate=rate, ceil=rate,
               burst=_burst(rate), cburst=_burst(rate), quantum=quantum)
        ipr.tc("add-filter", "u32", idx, parent=HTB_HANDLE, prio=1, protocol=0x0800,
               target=classid, keys=[f"0x{ipaddress.IPv4Address(ip).packed.hex()}/0xffffffff+12"])


# ---------------------------------------------------------- cleanup on exit/SIGTERM

_live: set["Lab"] = set()
_live_lock = threading.Lock()
_atexit_installed = False
_sigterm_installed = False


def _close_live_labs() -> None:
    with _live_lock:
        labs = list(_live)
    for lab in labs:
        lab.close()


def _on_sigterm(previous, signum, frame) -> None:
    """Tear live labs down, then let SIGTERM do what it would have done."""
    _close_live_labs()
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_exit_hooks() -> None:
    """atexit always; SIGTERM when we can (signal handlers are main-thread only)."""
    global _atexit_installed, _sigterm_installed
    if not _atexit_installed:
        atexit.register(_close_live_labs)
        _atexit_installed = True
    if not _sigterm_installed and threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, functools.partial(_on_sigterm, previous))
        _sigterm_installed = True


# ------------------------------------------------------------------------- the lab

class Lab:
    """Switch + N workers in network namespaces; a context manager.

    with Lab(workers=2) as lab:
        lab.run(lab.workers[0], ["ping", "-c1", lab.switch.ip])

    Loss and duplication of data-port UDP, per link and direction, settable at
    run time (switchml_xdp/lab/loss.py):

    with Lab(workers=4, loss="5%") as lab:
        lab.set_loss(0.2, dup=0.01, hosts=["w0"], direction="up")
        lab.loss_counters()["w0"]["up"]      # seen, dropped, duplicated, passed

    keep=True leaves the lab up when the `with` block ends (`swml-lab up`, or to
    inspect a failed run); `swml-lab down PREFIX` removes it. A build that fails
    half-way is always undone.
    """

    def __init__(self, workers: int = 2, prefix: str | None = None,
                 rate_mbit: float | None = None, keep: bool = False,
                 loss: float | str | None = None, dup: float | str | None = None,
                 loss_port: int | None = None):
        """loss, dup: probabilities (0.05 or "5%") of dropping, and of
        duplicating, data-port UDP frames on every worker link in both
        directions; giving either (or loss_port) attaches the loss injector at
        build time, set_loss() does it later otherwise. loss_port: the UDP
        port subject to loss (default the switch's data port; 0 = all UDP)."""
        self.prefix = prefix or new_prefix()
        _check_args(workers, self.prefix, rate_mbit)
        from switchml_xdp.lab import loss as _loss
        try:
            self.loss = None if loss is None else _loss.probability(loss, "loss")
            self.dup = None if dup is None else _loss.probability(dup, "dup")
            self.loss_port = None if loss_port is None else _loss.check_port(loss_port)
        except _loss.LossError as e:
            raise LabError(str(e)) from None
        self.rate_mbit = rate_mbit
        self.keep = keep
        self.bridge_ns = f"{self.prefix}-br"
        self.bridge = f"{self.prefix}-br0"
        self.switch = _switch_host(self.prefix)
        self.workers = [_worker_host(self.prefix, i) for i in range(workers)]
        self._created: list[str] = []           # namespaces this object made
        self._procs: list[subprocess.Popen] = []
        self._iprs: dict[str, IPRoute] = {}
        self._bpf = None
        self._loss = None                        # LossInjector, once loss is asked for
        self._loss_lock = threading.Lock()
        self._started = self._closed = False

    # -- public surface -------------------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        """The switch, then the workers in rank order."""
        return [self.switch, *self.workers]

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(h.ns for h in self.hosts)]

    def host(self, which: Host | str) -> Host:
        """A Host given itself, its name ("sw", "w0") or its namespace."""
        if isinstance(which, Host):
            return which
        for h in self.hosts:
            if which in (h.name, h.ns):
                return h
        raise LabError(f"lab {self.prefix} has no host {which!r}")

    def popen(self, host: Host | str, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start argv inside the host's network namespace; stopped at close()."""
        proc = netns.popen_in(self.host(host).ns, argv, **kw)
        self._procs.append(proc)
        return proc

    def run(self, host: Host | str, argv: Sequence[str], check: bool = True,
            **kw) -> subprocess.CompletedProcess:
        """Run argv to completion inside the host's namespace.

        Output is captured as text unless the caller routes stdout/stderr, so a
        CalledProcessError carries what the command said.
        """
        if "stdout" not in kw and "stderr" not in kw and "capture_output" not in kw:
            kw.update(capture_output=True, text=True)
        return netns.run_in(self.host(host).ns, argv, check=check, **kw)

    def enter(self, host: Host | str) -> contextlib.AbstractContextManager[None]:
        """Move the calling thread (only it) into the host's namespace for a `with` block."""
        return netns.in_netns(self.host(host).ns)

    def describe(self) -> dict:
        """What the state file holds: enough to find and use the lab later."""
        return {
            "prefix": self.prefix,
            "bridge": {"ns": self.bridge_ns, "iface": self.bridge},
            "rate_mbit": self.rate_mbit,
            "loss": self.loss, "dup": self.dup, "loss_port": self.loss_port,
            "switch": dataclasses.asdict(self.switch),
            "workers": [dataclasses.asdict(w) for w in self.workers],
            "owner_pid": None if self.keep else os.getpid(),
        }

    @classmethod
    def from_state(cls, prefix: str) -> "Lab":
        """A handle on a lab left up by another process (`swml-lab up`).

        It is keep=True: leaving a `with` block does not remove it; close() does.
        """
        try:
            state = json.loads(state_path(prefix).read_text())
        except FileNotFoundError:
            raise LabError(f"no lab with prefix {prefix!r} (no {state_path(prefix)})") from None
        lab = cls(workers=len(state["workers"]), prefix=prefix,
                  rate_mbit=state.get("rate_mbit"), keep=True, loss=state.get("loss"),
                  dup=state.get("dup"), loss_port=state.get("loss_port"))
        missing = [ns for ns in lab.namespaces if not netns.ns_path(ns).exists()]
        if missing:
            raise LabError(f"lab {prefix} is incomplete: namespace {missing[0]} is gone")
        lab._created = lab.namespaces
        lab._started = True
        return lab

    # -- loss and duplication (switchml_xdp/lab/loss.py) ----------------------------

    def set_loss(self, loss: float | str = 0.0, dup: float | str = 0.0, *,
                 hosts: Sequence[Host | str] | None = None, direction: str = "both",
                 port: int | None = None) -> None:
        """Drop data-port UDP frames with probability `loss` and duplicate the
        ones that pass with probability `dup` (fractions, or "5%"), on the links
        of `hosts` (default: every worker; the switch's link is a host too,
        "sw") in `direction`: "up" (what the host sends), "down" (what it
        receives) or "both". `port` changes the UDP port subject to loss for
        the whole lab (0 = all UDP). Takes effect for the next frame; the
        first call on a lab without the injector compiles and attaches it."""
        from switchml_xdp.lab.loss import LossError
        try:
            injector = self._loss_injector(create=True)
            if port is not None:
                injector.set_port(port)
            injector.set(loss, dup, hosts, direction)
        except LossError as e:
            raise LabError(str(e)) from None

    def loss_settings(self, hosts: Sequence[Host | str] | None = None) -> dict:
        """{host name: {"up": {"loss": p, "dup": q}, "down": {...}}} for `hosts`
        (default every host), or {} if the lab has no loss injector."""
        injector = self._loss_injector(create=False)
        return injector.settings(hosts) if injector else {}

    def loss_counters(self, hosts: Sequence[Host | str] | None = None) -> dict:
        """{host name: {"up"|"down": {"seen", "dropped", "duplicated", "passed"}}}
        for `hosts` (default every host), counted since the injector was
        attached: seen = dropped + passed, and the copies delivered are passed
        + duplicated. {} if the lab has no loss injector."""
        injector = self._loss_injector(create=False)
        return injector.counters(hosts) if injector else {}

    def _loss_injector(self, create: bool):
        """The lab's LossInjector: ours, or the pinned one of whoever attached
        it (Lab.from_state), or with `create` a new one; None if there is none."""
        from switchml_xdp.lab.loss import LossInjector
        with self._loss_lock:
            if self._loss is None and self._started and not self._closed:
                self._loss = LossInjector.open(self)
                if self._loss is None and create:
                    with contextlib.closing(netns.iproute_in(self.bridge_ns)) as br:
                        self._loss = LossInjector.attach(self, br)
            if self._loss is None and create:
                raise LabError(f"lab {self.prefix} is not up")
            return self._loss

    # -- lifecycle --------------------------------------------------------------

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.close()

    def start(self) -> "Lab":
        """Build the topology; on any failure remove whatever was made, then raise."""
        if self._started:
            return self
        if os.geteuid() != 0:
            raise LabError("the lab needs root (network namespaces, XDP): run it with sudo")
        taken = [ns for ns in self.namespaces if netns.ns_path(ns).exists()]
        if taken:
            raise LabError(f"namespace {taken[0]} exists: prefix {self.prefix} is in use")
        _install_exit_hooks()
        with _live_lock:
            _live.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        finally:
            self._close_iprs()
        self._started = True
        if self.keep:
            with _live_lock:
                _live.discard(self)
        return self

    def close(self) -> None:
        """Remove everything the lab made. Idempotent, and safe to re-enter (a
        SIGTERM arriving mid-close runs it again, every step tolerates "gone")."""
        if self._closed:
            return
        self._stop_processes()
        self._close_iprs()
        if self._loss is not None:
            with contextlib.suppress(Exception):
                self._loss.close()
            self._loss = None
        if self._bpf is not None:
            with contextlib.suppress(Exception):
                self._bpf.cleanup()
            self._bpf = None
        for ns in reversed(self._created):
            try:
                netns.remove_netns(ns)
            except OSError as e:
                log.warning("lab %s: could not remove namespace %s: %s", self.prefix, ns, e)
        if self._created:
            _remove_loss_pins(self.prefix)
        state_path(self.prefix).unlink(missing_ok=True)
        with _live_lock:
            _live.discard(self)
        self._closed = True

    # -- building ----------------------------------------------------------------

    def _build(self) -> None:
        # State first: while any namespace of ours exists, its owner is on record,
        # so cleanup_leftovers(orphans_only=True) never takes a lab mid-build.
        self._write_state()
        for ns in self.namespaces:
            self._make_namespace(ns)
        self._make_bridge()
        for host in self.hosts:
            self._make_link(host)
        if self.loss is None and self.dup is None and self.loss_port is None:
            self._attach_pass_program()
        else:
            self._attach_loss_injector()
        if self.rate_mbit is not None:
            self._shape_worker_links()

    def _ipr(self, ns: str) -> IPRoute:
        """One netlink socket per namespace for the duration of the build."""
        if ns not in self._iprs:
            self._iprs[ns] = netns.iproute_in(ns)
        return self._iprs[ns]

    def _close_iprs(self) -> None:
        for ipr in self._iprs.values():
            with contextlib.suppress(Exception):
                ipr.close()
        self._iprs.clear()

    def _make_namespace(self, ns: str) -> None:
        """A quiet namespace: IPv6 off (no router/neighbour solicitations, no MLD
        in captures), loopback up. Set before any veth moves in, so `default`
        covers them."""
        netns.create_netns(ns)
        self._created.append(ns)
        for conf in ("all", "default"):
            netns.write_sysctl(ns, f"net.ipv6.conf.{conf}.disable_ipv6", "1")
        ipr = self._ipr(ns)
        ipr.link("set", index=_index(ipr, "lo"), state="up")

    def _make_bridge(self) -> None:
        """Multicast snooping off: no IGMP querier here, and with snooping on the
        bridge would stop flooding the switch's result group once its timers
        expire. Off, multicast floods to every port like broadcast."""
        ipr = self._ipr(self.bridge_ns)
        ipr.link("add", ifname=self.bridge, kind="bridge", br_mcast_snooping=0)
        # A real switch port does not run the IP stack's checks or iptables on
        # what it forwards; br_netfilter (built into kernels like this one) would
        # drop malformed frames the tests send on purpose, and cost CPU.
        for family in ("iptables", "ip6tables", "arptables"):
            key = f"net.bridge.bridge-nf-call-{family}"
            if (Path("/proc/sys") / key.replace(".", "/")).exists():
                netns.write_sysctl(self.bridge_ns, key, "0")
        ipr.link("set", index=_index(ipr, self.bridge), address=_mac(1, 0, 0), state="up")

    def _make_link(self, host: Host) -> None:
        """Veth from the bridge namespace straight into the host's: the pair never
        shows up in the namespace this process runs in."""
        br = self._ipr(self.bridge_ns)
        fd = netns.netns_fd(host.ns)
        try:
            br.link("add", ifname=host.peer, kind="veth",
                    peer={"ifname": host.iface, "net_ns_fd": fd})
        finally:
            os.close(fd)
        group, index = (0, 1) if host is self.switch else (1, self.workers.index(host))
        br.link("set", index=_index(br, host.peer), address=_mac(1, group, index),
                master=_index(br, self.bridge), state="up")
        ipr = self._ipr(host.ns)
        i = _index(ipr, host.iface)
        ipr.link("set", index=i, address=host.mac)
        ipr.addr("add", index=i, address=host.ip, prefixlen=SUBNET_PREFIXLEN)
        ipr.link("set", index=i, state="up")

    def _attach_pass_program(self) -> None:
        """Compile xdp/swml_pass.c once and attach it to every bridge-side end."""
        try:
            from bcc import BPF
        except ImportError:
            raise LabError("the lab needs bcc (Debian package python3-bpfcc)") from None
        self._bpf = BPF(src_file=str(xdp_dir() / PASS_SOURCE).encode())
        prog = self._bpf.load_func(b"swml_pass", BPF.XDP)
        br = self._ipr(self.bridge_ns)
        for host in self.hosts:
            attach_xdp(br, host.peer, prog.fd)

    def _attach_loss_injector(self) -> None:
        """The loss injector instead of the pass program (it passes by default)."""
        from switchml_xdp.lab.loss import LossInjector
        self._loss = LossInjector.attach(self, self._ipr(self.bridge_ns))
        if self.loss_port is not None:
            self._loss.set_port(self.loss_port)
        self._loss.set(self.loss or 0.0, self.dup or 0.0)

    def _shape_worker_links(self) -> None:
        """Every worker gets rate_mbit up and rate_mbit down, whatever sends.

            downstream to worker i   TBF on the egress of its bridge port b{i}:
                                     all it receives was forwarded by the bridge
                                     (dev_queue_xmit), the switch's XDP_TX'd
                                     RESULTs and Gloo's TCP from other workers too
            upstream, worker i ->    HTB on the egress of the switch's bridge port
            switch                   bs, one class per worker (by source IP) at
                                     the rate: shapes AF_XDP frames, which skip
                                     the worker's own qdisc, each worker on its
                                     own, and the port is not a shared bottleneck
            upstream, kernel         TBF on the worker's own interface: covers
            sockets                  worker -> worker traffic (Gloo), which never
                                     crosses bs; to the switch it is shaped twice
                                     at the same rate, which changes nothing

        The switch's own interface stays unshaped: a real switch's ports are as
        fast as the workers' and the workers' links are the bottleneck. The
        loss injector's clsact hooks on the bridge ports run before these qdiscs
        and are independent of them."""
        br = self._ipr(self.bridge_ns)
        for w in self.workers:
            shape(self._ipr(w.ns), w.iface, self.rate_mbit)
            shape(br, w.peer, self.rate_mbit)
        shape_per_source(br, self.switch.peer, self.rate_mbit, [w.ip for w in self.workers])

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        path = state_path(self.prefix)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.describe(), indent=2) + "\n")
        tmp.replace(path)

    def _stop_processes(self) -> None:
        """Our own children first, then anything else still inside our namespaces
        (a process there would keep the namespace, and its veths, alive)."""
        netns.terminate_pids([p.pid for p in self._procs if p.poll() is None])
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=1)
        self._procs.clear()
        netns.terminate_pids(netns.pids_in(self._created))


# ------------------------------------------------------------------ leftovers

def _prefix_of(ns: str) -> str:
    return ns.rsplit("-", 1)[0]


def _owner_alive(prefix: str) -> bool:
    """True if the lab's state file names a running owner, or says keep (owner None)."""
    try:
        owner = json.loads(state_path(prefix).read_text()).get("owner_pid", 0)
    except (OSError, ValueError):
        return False
    if owner is None:
        return True
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return owner != os.getpid() or any(lab.prefix == prefix for lab in list(_live))


def lab_namespaces(prefix: str | None = None) -> list[str]:
    """Namespaces of lab `prefix`, or every namespace named "swl*" if None."""
    if prefix is None:
        return [ns for ns in netns.list_netns() if ns.startswith(PREFIX_STEM)]
    own = re.compile(rf"{re.escape(prefix)}-(br|sw|w\d+)")
    return [ns for ns in netns.list_netns() if own.fullmatch(ns)]


def cleanup_leftovers(prefix: str | None = None, orphans_only: bool = False) -> list[str]:
    """Remove lab namespaces (and the processes in them, and state files).

    prefix: that lab only; None: every namespace whose name starts with "swl".
    orphans_only: spare labs whose owning process still runs or that were left
    up on purpose (`swml-lab up`), so that a test session tidying up after a
    killed run does not pull a concurrent run's lab from under it.
    Returns the namespaces removed.
    """
    names = lab_namespaces(prefix)
    prefixes = {_prefix_of(ns) for ns in names}
    if prefix is not None:
        prefixes.add(prefix)
    else:
        prefixes |= {p.name[len("lab-"):-len(".json")] for p in STATE_DIR.glob(f"lab-{PREFIX_STEM}*.json")}
    if orphans_only:
        prefixes = {p for p in prefixes if not _owner_alive(p)}
        names = [ns for ns in names if _prefix_of(ns) in prefixes]
    netns.terminate_pids(netns.pids_in(names))
    removed = [ns for ns in names if netns.remove_netns(ns)]
    for p in prefixes:
        state_path(p).unlink(missing_ok=True)
        _remove_loss_pins(p)
    return removed


def _remove_loss_pins(prefix: str) -> None:
    from switchml_xdp.lab.loss import remove_pins
    remove_pins(prefix)


def running_labs() -> list[dict]:
    """State of every lab that has a state file (kept and in-use ones)."""
    out = []
    for path in sorted(STATE_DIR.glob("lab-*.json")):
        with contextlib.suppress(OSError, ValueError):
            out.append(json.loads(path.read_text()))
    return out


def iter_hosts(state: dict) -> Iterator[Host]:
    """Hosts of a state dict (from describe() or a state file): switch first."""
    yield Host(**state["switch"])
    for w in state["workers"]:
        yield Host(**w)
