"""An emulated cluster on one machine: a switch (or M boxes, switch hosts) and
N workers on a Linux bridge, each in its own network namespace (names and
addresses: lab/addressing.py).

How it is built, step by step: lab/wiring.py. Bridge-side veth ends carry
an XDP pass program: see xdp/lab/swml_pass.c for why veth needs one.
Optional shaping (rate_mbit, lab/shaping.py) gives every worker link the
same rate in each direction, for every kind of traffic; box_rate_mbit
every box's link.
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

from pyroute2 import IPRoute

from .. import bpf
from . import addressing, box_ports, lifecycle, link_mtu, netns, steering, wiring
from . import igmp as igmp_mod  # `igmp` is a Lab attribute and argument
from . import loss as loss_mod  # `loss` is a Lab attribute and argument
from .addressing import Host, box_host, bridge_iface, bridge_ns, check_names, new_prefix, worker_host
from .errors import LabError
from .shaping import box_rates, check_bands, check_queue, check_rate, shape_links

log = logging.getLogger(__name__)


class Lab:
    """Switch + N workers in network namespaces; a context manager.

    with Lab(workers=2) as lab:
        lab.run(lab.workers[0], ["ping", "-c1", lab.switch.ip])

    Loss and duplication of data-port UDP, per link and direction, settable at
    run time (switchml_xdp/lab/loss.py):

    with Lab(workers=4, loss="5%") as lab:
        lab.set_loss(0.2, dup=0.01, hosts=["w0"], direction="up")
        lab.loss_counters()["w0"]["up"]      # seen, dropped, duplicated, passed, bad, ...
        lab.set_loss("5%", burst=4)          # 5 % in bursts of 4 frames (lab/burst.py)

    keep=True leaves the lab up when the `with` block ends (`swml-lab up`, or to
    inspect a failed run); `swml-lab down PREFIX` removes it. A build that fails
    half-way is always undone.
    """

    def __init__(self, workers: int = 2, prefix: str | None = None,
                 rate_mbit: float | None = None, keep: bool = False,
                 loss: float | str | None = None, dup: float | str | None = None,
                 loss_port: int | None = None, igmp: bool = False,
                 queue_packets: int | None = None, multicast: bool = True,
                 query_interval_s: float | None = None, boxes: int = 1,
                 box_rate_mbit: float | None = None, ports: int = 1,
                 dscp_bands: Sequence[int] | None = None, burst=None, mtu: int | None = None,
                 link_queues: int = 1, port_hooks: str = "every"):
        """loss, dup: probabilities (0.05 or "5%") of dropping, and of duplicating, data-port UDP
        frames on every worker link in both directions; giving either (or loss_port) attaches the
        loss injector at build time, set_loss() does it later otherwise. loss_port: the UDP port
        subject to loss (default the switch's data port; 0 = all UDP). burst: the loss comes in
        bursts (lab/burst.py resolve: a mean burst length, or a BurstModel). igmp: the bridge snoops
        IGMP and, once the querier on its uplink asked, floods no group nobody joined, like a
        strict switch (lab/igmp.py); the querier asks every query_interval_s (default the tests'
        5 s; real networks' is 125 s, igmp.REAL_QUERY_INTERVAL_S). queue_packets: every shaped
        bridge port's queue depth, a switch port's buffer (needs a rate; lab/shaping.py).
        multicast=False: the bridge carries no IPv4 multicast from the switch, as a cloud VPC (for
        `swml-switch up --fanout unicast`; not with loss, whose injector takes the switch's port).
        boxes: how many switch hosts (lab.switches; lab.switch is the first), box_rate_mbit the
        rate of each one's link, both ways, or a list of one each (lab/shaping.py). ports: the
        switch as a box with that many ports, each on its own segment (lab/box_ports.py);
        box_rate_mbit is then each port's. dscp_bands: DSCP values, highest priority first, that
        every box's port serves in that order (needs both rates; lab/shaping.py). mtu: every link's
        MTU (default the kernel's 1500; at most one page's frame for XDP, lab/link_mtu.py).
        link_queues: every link's queues (lab/wiring.py make_link), UDP to port p on queue p mod
            link_queues, as a NIC's ntuple rules would put it (lab/steering.py).
        port_hooks: which bridge ports carry the lab's XDP pass program, "every" (the default: all
        figures so far) or "boxes" (only where an XDP program sends into the link; the workers'
        frames then cross the bridge as the stack made them: lab/wiring.py PORT_HOOKS)."""
        self.prefix = prefix or new_prefix()
        check_names(workers, self.prefix, boxes)
        check_rate(rate_mbit)
        box_ports.check_ports(ports, boxes, igmp)
        box_rates(box_rate_mbit, max(boxes, ports))
        check_queue(queue_packets)
        self.dscp_bands = check_bands(dscp_bands, rate_mbit is not None and box_rate_mbit is not None)
        if queue_packets is not None and rate_mbit is None and box_rate_mbit is None:
            raise LabError("a queue depth needs a rate (the queue is the shaper's)")
        self.queue_packets = queue_packets
        lossy = loss_mod.lab_args(loss, dup, loss_port, burst)
        self.loss, self.dup, self.loss_port, self.burst = lossy
        if not multicast and lossy != (None,) * 4:
            raise LabError("a lab without multicast takes no loss or dup (both use the "
                           "switch's bridge port)")
        self.multicast = multicast
        self.rate_mbit, self.box_rate_mbit, self.mtu = rate_mbit, box_rate_mbit, link_mtu.check_mtu(mtu)
        self.link_queues = wiring.check_link_queues(link_queues)
        self.port_hooks = wiring.check_port_hooks(port_hooks)
        self.keep = keep
        self.igmp = igmp
        if query_interval_s is not None and not igmp:
            raise LabError("a query interval needs the snooping bridge (igmp)")
        try:
            self.query_interval_s = igmp_mod.check_query_interval(
                igmp_mod.QUERY_INTERVAL_S if query_interval_s is None else query_interval_s)
        except ValueError as e:
            raise LabError(str(e)) from None
        self.bridge_ns = bridge_ns(self.prefix)
        self.bridge = bridge_iface(self.prefix)
        self.switches = [box_host(self.prefix, b) for b in range(boxes)]
        self.switch = self.switches[0]
        self.box_ports = box_ports.extra_ports(self.prefix, ports)   # its ports after the first
        self.workers = [worker_host(self.prefix, i) for i in range(workers)]
        self._created: list[str] = []           # namespaces this object made
        self._procs: list[subprocess.Popen] = []
        self._iprs: dict[str, IPRoute] = {}
        self._pass: bpf.Program | None = None   # the pass program, once attached
        self._loss = None                        # LossInjector, once loss is asked for
        self._steer: bpf.Program | None = None   # the queue steering, with link_queues > 1
        self._loss_lock = threading.Lock()
        self._started = self._closed = False

    # -- public surface -------------------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        """The boxes (the switch first), then the workers in rank order."""
        return [*self.switches, *self.workers]

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, *(h.ns for h in self.hosts)]

    def host(self, which: Host | str) -> Host:
        """A Host given itself, its name ("sw", "sw1", "w0") or its namespace."""
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
            "rate_mbit": self.rate_mbit, "box_rate_mbit": self.box_rate_mbit,
            "queue_packets": self.queue_packets, "dscp_bands": self.dscp_bands,
            "loss": self.loss, "dup": self.dup, "loss_port": self.loss_port,
            "burst": loss_mod.burst_state(self.burst),
            "igmp": self.igmp, "query_interval_s": self.query_interval_s if self.igmp else None,
            "multicast": self.multicast, "mtu": self.mtu, "link_queues": self.link_queues,
            "port_hooks": self.port_hooks,
            "switch": dataclasses.asdict(self.switch),
            "switches": [dataclasses.asdict(b) for b in self.switches],
            "ports": 1 + len(self.box_ports),
            "workers": [dataclasses.asdict(w) for w in self.workers],
            "owner_pid": None if self.keep else os.getpid(),
            **lifecycle.owner_fields(),
        }

    @classmethod
    def from_state(cls, prefix: str) -> Lab:
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
                  multicast=state.get("multicast", True),
                  query_interval_s=state.get("query_interval_s"),
                  boxes=len(state.get("switches") or [state["switch"]]),
                  box_rate_mbit=state.get("box_rate_mbit"), ports=state.get("ports", 1),
                  dscp_bands=state.get("dscp_bands"), burst=state.get("burst"), mtu=state.get("mtu"),
                  link_queues=state.get("link_queues", 1),
                  port_hooks=state.get("port_hooks", "every"))
        missing = [ns for ns in lab.namespaces if not netns.ns_path(ns).exists()]
        if missing:
            raise LabError(f"lab {prefix} is incomplete: namespace {missing[0]} is gone")
        lab._created = lab.namespaces
        lab._started = True
        return lab

    # -- loss and duplication (switchml_xdp/lab/loss.py) ----------------------------

    def set_loss(self, loss: float | str = 0.0, dup: float | str = 0.0, *,
                 hosts: Sequence[Host | str] | None = None, direction: str = "both",
                 port: int | None = None, burst=None) -> None:
        """Drop data-port UDP frames with probability `loss` and duplicate the
        ones that pass with probability `dup` (fractions, or "5%"), on the links
        of `hosts` (default: every worker; each box's link is a host too,
        "sw", "sw1") in `direction`: "up" (what the host sends), "down" (what it
        receives) or "both". `port` changes the UDP port subject to loss for
        the whole lab (0 = all UDP). `burst`: the loss comes in bursts (a
        mean burst length, then `loss` is the mean rate; or a BurstModel, then
        `loss` is its good state's: lab/burst.py). Takes effect for the next
        frame; the first call on a lab without the injector attaches it."""
        try:
            injector = self._loss_injector(create=True)
            if port is not None:
                injector.set_port(port)
            injector.set(loss, dup, hosts, direction, burst)
        except loss_mod.LossError as e:
            raise LabError(str(e)) from None

    def loss_settings(self, hosts: Sequence[Host | str] | None = None) -> dict:
        """{host name: {"up": {"loss": p, "dup": q, "burst": model}, "down": {...}}}
        for `hosts` (default every host), or {} if the lab has no loss injector."""
        injector = self._loss_injector(create=False)
        return injector.settings(hosts) if injector else {}

    def loss_counters(self, hosts: Sequence[Host | str] | None = None) -> dict:
        """{host name: {"up"|"down": {"seen", "dropped", "duplicated", "passed", ...}}}
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
                    self._loss = loss_mod.LossInjector.attach(self)
            if self._loss is None and create:
                raise LabError(f"lab {self.prefix} is not up")
            return self._loss

    # -- lifecycle --------------------------------------------------------------

    def __enter__(self) -> Lab:
        return self.start()

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.close()

    def start(self) -> Lab:
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
        for prog in (self._pass, self._steer):
            if prog is not None:
                with contextlib.suppress(Exception):
                    prog.close()
        self._pass = self._steer = None
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
        box_ports.make_segments(self._ipr(self.bridge_ns), self.bridge_ns, self.prefix,
                                1 + len(self.box_ports))
        for host in self.hosts:
            self._make_link(host)
        box_ports.build(self._ipr, self)
        link_mtu.apply(self._ipr, self.namespaces, self.mtu)   # before XDP: veth checks it then
        if (self.loss, self.dup, self.loss_port, self.burst) == (None,) * 4:
            self._attach_pass_program()
        else:
            self._attach_loss_injector()
        if self.link_queues > 1:
            self._steer = steering.attach(self.bridge_ns, self.hosts + self.box_ports,
                                          self.link_queues)
        if self.rate_mbit is not None or self.box_rate_mbit is not None:
            shape_links(self._ipr, self.bridge_ns, self.switches + self.box_ports, self.workers,
                        self.rate_mbit, self.queue_packets, self.box_rate_mbit, self.dscp_bands)
        if self.igmp:
            self._wait_for_querier()

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
        netns.create_netns(ns)
        self._created.append(ns)
        wiring.quiet_namespace(ns, self._ipr(ns))

    def _make_bridge(self) -> None:
        wiring.make_bridge(self._ipr(self.bridge_ns), self.bridge_ns, self.bridge,
                           querier_ip=self.switch.ip if self.igmp else None,
                           query_interval_s=self.query_interval_s,
                           querier_links=addressing.querier_links(self.prefix))

    def _wait_for_querier(self) -> None:
        """Ready once the bridge forwards by its table: strict from a job's first packet."""
        try:
            _, uplink, _ = addressing.querier_links(self.prefix)
            igmp_mod.wait_for_querier(self.bridge_ns, self.bridge, uplink)
        except RuntimeError as e:
            raise LabError(str(e)) from None

    def _make_link(self, host: Host) -> None:
        segment = 0 if host in self.switches else box_ports.segment_of(
            self.workers.index(host), 1 + len(self.box_ports))
        wiring.make_link(self._ipr(self.bridge_ns), self._ipr(host.ns), self.bridge_ns,
                         addressing.segment_bridge(self.prefix, segment), host,
                         box_qdisc=host in self.switches and self.box_rate_mbit is None,
                         queues=self.link_queues)

    def _attach_pass_program(self) -> None:
        try:
            self._pass = bpf.compile_program(wiring.PASS_SOURCE, wiring.PASS_PROG)
            wiring.attach_pass_program(self._pass, self.bridge_ns, self.hosts + self.box_ports,
                                       self.switches + self.box_ports, self.multicast,
                                       boxes_only=self.port_hooks == "boxes")
        except bpf.BpfError as e:
            raise LabError(f"cannot attach the lab's pass program: {e}") from e

    def _attach_loss_injector(self) -> None:
        """The loss injector instead of the pass program (it passes by default)."""
        self._loss = loss_mod.LossInjector.attach(self)
        if self.loss_port is not None:
            self._loss.set_port(self.loss_port)
        self._loss.set(self.loss or 0.0, self.dup or 0.0, burst=self.burst)

    def _stop_processes(self) -> None:
        """Our own children first, then anything else still inside our namespaces
        (a process there would keep the namespace, and its veths, alive)."""
        netns.terminate_pids([p.pid for p in self._procs if p.poll() is None])
        for p in self._procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=1)
        self._procs.clear()
        netns.terminate_pids(netns.pids_in(self._created))
