"""An emulated cluster on one machine: a switch and N workers on a Linux bridge,
each in its own network namespace (names and addresses: lab/addressing.py).

Bridge-side veth ends carry an XDP pass program: see xdp/lab/swml_pass.c for
why veth needs one. Optional shaping (rate_mbit, lab/shaping.py) gives every
worker link the same rate in each direction, for every kind of traffic.
Optional loss and duplication per link and direction replace the pass
program with the loss injector (xdp/lab/swml_loss.c, lab/loss.py). A lab
that is up is registered for removal at exit and on SIGTERM, and describes
itself in a state file (lab/lifecycle.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from pyroute2 import IPRoute

from .. import bpf, net
from . import igmp as igmp_mod  # `igmp` is a Lab attribute and argument
from . import lifecycle, netns
from . import loss as loss_mod  # `loss` is a Lab attribute and argument
from .addressing import (
    SUBNET_PREFIXLEN, Host, bridge_iface, bridge_mac, bridge_ns, check_names, new_prefix,
    peer_mac, switch_host, worker_host,
)
from .errors import LabError
from .shaping import check_queue, check_rate, shape_links

log = logging.getLogger(__name__)

PASS_SOURCE = "lab/swml_pass.c"
PASS_PROG = "swml_pass"
NO_MULTICAST_PROG = "swml_pass_no_multicast"   # in PASS_SOURCE too
# The switch's own interface gets a qdisc, as a real NIC has (veth's default
# is none): what the stack sends there (the unicast fan-out's copies, above
# all) then waits when the peer's 256-frame ring is full, where without one
# veth drops it. XDP_TX'd frames never pass a qdisc. The depth: Linux's
# default txqueuelen.
SWITCH_QDISC_HANDLE = 0x10000    # 1:
SWITCH_QDISC_PACKETS = 1000


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
                 loss_port: int | None = None, igmp: bool = False,
                 queue_packets: int | None = None, multicast: bool = True):
        """loss, dup: probabilities (0.05 or "5%") of dropping, and of
        duplicating, data-port UDP frames on every worker link in both
        directions; giving either (or loss_port) attaches the loss injector at
        build time, set_loss() does it later otherwise. loss_port: the UDP
        port subject to loss (default the switch's data port; 0 = all UDP).
        igmp: the bridge snoops IGMP, runs a querier and floods no group
        nobody joined, like a strict switch (lab/igmp.py). queue_packets:
        every shaped queue's depth in packets, a switch port's buffer
        (needs rate_mbit; lab/shaping.py). multicast=False: the bridge
        carries no IPv4 multicast from the switch, as a cloud VPC (for
        `swml-switch up --fanout unicast`; not with loss, whose injector
        takes the switch's port)."""
        self.prefix = prefix or new_prefix()
        check_names(workers, self.prefix)
        check_rate(rate_mbit)
        check_queue(queue_packets)
        if queue_packets is not None and rate_mbit is None:
            raise LabError("a queue depth needs a rate (the queue is the shaper's)")
        self.queue_packets = queue_packets
        if not multicast and (loss is not None or dup is not None or loss_port is not None):
            raise LabError("a lab without multicast takes no loss or dup (both use the "
                           "switch's bridge port)")
        self.multicast = multicast
        try:
            self.loss = None if loss is None else loss_mod.probability(loss, "loss")
            self.dup = None if dup is None else loss_mod.probability(dup, "dup")
            self.loss_port = None if loss_port is None else loss_mod.check_port(loss_port)
        except loss_mod.LossError as e:
            raise LabError(str(e)) from None
        self.rate_mbit = rate_mbit
        self.keep = keep
        self.igmp = igmp
        self.bridge_ns = bridge_ns(self.prefix)
        self.bridge = bridge_iface(self.prefix)
        self.switch = switch_host(self.prefix)
        self.workers = [worker_host(self.prefix, i) for i in range(workers)]
        self._created: list[str] = []           # namespaces this object made
        self._procs: list[subprocess.Popen] = []
        self._iprs: dict[str, IPRoute] = {}
        self._pass: bpf.Program | None = None   # the pass program, once attached
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
            "rate_mbit": self.rate_mbit, "queue_packets": self.queue_packets,
            "loss": self.loss, "dup": self.dup, "loss_port": self.loss_port,
            "igmp": self.igmp,
            "multicast": self.multicast,
            "switch": dataclasses.asdict(self.switch),
            "workers": [dataclasses.asdict(w) for w in self.workers],
            "owner_pid": None if self.keep else os.getpid(),
            **lifecycle.owner_fields(),
        }

    @classmethod
    def from_state(cls, prefix: str) -> "Lab":
        """A handle on a lab left up by another process (`swml-lab up`).

        It is keep=True: leaving a `with` block does not remove it; close() does.
        """
        state = lifecycle.read_state(prefix)
        if state is None:
            raise LabError(f"no lab with prefix {prefix!r} (no {lifecycle.state_path(prefix)})")
        lab = cls(workers=len(state["workers"]), prefix=prefix,
                  rate_mbit=state.get("rate_mbit"), keep=True, loss=state.get("loss"),
                  dup=state.get("dup"), loss_port=state.get("loss_port"),
                  igmp=state.get("igmp", False), queue_packets=state.get("queue_packets"),
                  multicast=state.get("multicast", True))
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
        try:
            injector = self._loss_injector(create=True)
            if port is not None:
                injector.set_port(port)
            injector.set(loss, dup, hosts, direction)
        except loss_mod.LossError as e:
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
        with self._loss_lock:
            if self._loss is None and self._started and not self._closed:
                self._loss = loss_mod.LossInjector.open(self)
                if self._loss is None and create:
                    with contextlib.closing(netns.iproute_in(self.bridge_ns)) as br:
                        self._loss = loss_mod.LossInjector.attach(self, br)
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
        lifecycle.track(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        finally:
            self._close_iprs()
        self._started = True
        if self.keep:
            lifecycle.untrack(self)
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
        if self._pass is not None:
            with contextlib.suppress(Exception):
                self._pass.close()
            self._pass = None
        for ns in reversed(self._created):
            try:
                netns.remove_netns(ns)
            except OSError as e:
                log.warning("lab %s: could not remove namespace %s: %s", self.prefix, ns, e)
        if self._created:
            lifecycle.remove_lab_files(self.prefix)
        else:
            lifecycle.state_path(self.prefix).unlink(missing_ok=True)
        lifecycle.untrack(self)
        self._closed = True

    # -- building ----------------------------------------------------------------

    def _build(self) -> None:
        # State first: while any namespace of ours exists, its owner is on record,
        # so cleanup_leftovers(orphans_only=True) never takes a lab mid-build.
        lifecycle.write_state(self.prefix, self.describe())
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
            shape_links(self._ipr, self.bridge_ns, self.switch, self.workers, self.rate_mbit,
                        self.queue_packets)

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
        self._ipr(ns).link("set", index=net.link_index("lo", ns), state="up")

    def _make_bridge(self) -> None:
        """Multicast snooping off: no IGMP querier here, and with snooping on the
        bridge would stop flooding the switch's result group once its timers
        expire. Off, multicast floods to every port like broadcast. With
        igmp=True: snooping, a querier and strict ports (lab/igmp.py)."""
        ipr = self._ipr(self.bridge_ns)
        mcast = igmp_mod.snooping_bridge_attrs() if self.igmp else {"br_mcast_snooping": 0}
        ipr.link("add", ifname=self.bridge, kind="bridge", **mcast)
        # A real switch port does not run the IP stack's checks or iptables on
        # what it forwards; br_netfilter (built into kernels like this one) would
        # drop malformed frames the tests send on purpose, and cost CPU.
        for family in ("iptables", "ip6tables", "arptables"):
            key = f"net.bridge.bridge-nf-call-{family}"
            if (Path("/proc/sys") / key.replace(".", "/")).exists():
                netns.write_sysctl(self.bridge_ns, key, "0")
        ipr.link("set", index=net.link_index(self.bridge, self.bridge_ns), address=bridge_mac(),
                 state="up")
        if self.igmp:
            igmp_mod.start_querier(ipr, net.link_index(self.bridge, self.bridge_ns), self.switch.ip,
                                   SUBNET_PREFIXLEN)

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
        br.link("set", index=net.link_index(host.peer, self.bridge_ns), address=peer_mac(host),
                master=net.link_index(self.bridge, self.bridge_ns), state="up")
        # A VLAN tag crossing the bridge stays in the frame, as on a wire: with
        # veth's tag insertion offloaded it would travel beside the frame, and
        # the receiver's XDP program would see a tagged frame untagged.
        net.set_features(host.peer, {"tx-vlan-hw-insert": False}, self.bridge_ns)
        if self.igmp:
            igmp_mod.stop_flooding_unknown_groups(br, net.link_index(host.peer, self.bridge_ns))
        ipr = self._ipr(host.ns)
        i = net.link_index(host.iface, host.ns)
        ipr.link("set", index=i, address=host.mac)
        ipr.addr("add", index=i, address=host.ip, prefixlen=SUBNET_PREFIXLEN)
        ipr.link("set", index=i, state="up")
        if host is self.switch:
            ipr.tc("add", "pfifo", i, SWITCH_QDISC_HANDLE, limit=SWITCH_QDISC_PACKETS)

    def _attach_pass_program(self) -> None:
        """Compile xdp/lab/swml_pass.c once and attach it, native, to every
        bridge-side end (on the switch's, without multicast, its variant that
        drops the switch's multicast)."""
        try:
            self._pass = bpf.compile_program(PASS_SOURCE, PASS_PROG)
            no_multicast = None if self.multicast else self._pass.load(NO_MULTICAST_PROG)
            for host in self.hosts:
                fd = no_multicast if host is self.switch and no_multicast else self._pass.fd
                bpf.attach(host.peer, fd, "native", netns=self.bridge_ns)
        except bpf.BpfError as e:
            raise LabError(f"cannot attach the lab's pass program: {e}") from e

    def _attach_loss_injector(self) -> None:
        """The loss injector instead of the pass program (it passes by default)."""
        self._loss = loss_mod.LossInjector.attach(self, self._ipr(self.bridge_ns))
        if self.loss_port is not None:
            self._loss.set_port(self.loss_port)
        self._loss.set(self.loss or 0.0, self.dup or 0.0)

    def _stop_processes(self) -> None:
        """Our own children first, then anything else still inside our namespaces
        (a process there would keep the namespace, and its veths, alive)."""
        netns.terminate_pids([p.pid for p in self._procs if p.poll() is None])
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=1)
        self._procs.clear()
        netns.terminate_pids(netns.pids_in(self._created))
