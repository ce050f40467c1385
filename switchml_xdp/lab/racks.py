"""RacksLab: a job's hosts in several racks, each rack a segment of its own
behind an uplink to a core segment with the parent box
(docs/scale-out.md, "A tree of boxes"; names and addresses: lab/addressing.py).

    rack r:  {p}-rk{r} ── w.. (10.0.{1+r}.11..) ── bp{r} ── {p}-r{r} 10.0.{1+r}.1 ┐ ns {p}-r{r}
                                                            {p}-u{r} 10.0.0.{2+r} ┘ (rack box)
    core:    {p}-br0 ── bu{r} (each rack's uplink) ── bs ── {p}-s 10.0.0.1 (ns {p}-sw, parent)

layout "tree": every rack has a rack box, a router between the rack's
subnet and the core's (`swml-switch up {p}-r{r} --uplink {p}-u{r} --parent
10.0.0.1` runs there); the workers of a rack reach only it on their
segment, and other racks through it. layout "flat": no rack boxes: the rack
box's namespace bridges its port and its uplink (no address, no XDP), so
the lab is one L2 segment and subnet, workers on 10.0.0.11.. as in the
plain lab, every one a member of the parent's job across the core, whose
multicast RESULTs flood every rack.

Shaping (lab/shaping.py), every rate both ways:

    worker links   rate_mbit: TBF on the worker's interface and on its bridge
                   port; HTB by source on the rack port's bridge port (frames
                   that skipped the worker's qdisc: AF_XDP)
    uplinks        uplink_rate_mbit: down, TBF on the uplink's bridge port;
                   up, TBF on the uplink itself (what the rack box's stack or
                   bridge sends) and, tree, HTB by source on the parent's
                   bridge port, a class an uplink (what the rack box's XDP
                   program sends up skips the uplink's qdisc)
    queues         queue_packets on the bridge's side (the switches' ports);
                   the workers' and uplinks' own interfaces keep a host's
                   queue (lab/shaping.py, shape_links)

Loss (lab/loss.py) goes on the workers' links and the uplinks, the links a
real rack has; the rack box's and the parent's own attachments to their
segments are the lab's, lossless.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence

from .. import bpf, net
from . import lifecycle, netns, wiring
from . import loss as loss_mod
from .addressing import (
    MAX_BOXES,
    MAX_WORKERS,
    SUBNET_PREFIXLEN,
    Host,
    rack_bridge,
    rack_port_host,
    rack_worker_host,
    uplink_host,
)
from .errors import LabError
from .namespace_lab import Lab
from .shaping import check_queue, check_rate, host_queue, shape, shape_per_source
from .wiring import HOST_QUEUE_PACKETS

LAYOUTS = ("tree", "flat")
MAX_RACKS = MAX_BOXES - 1   # the rack boxes are the lab's boxes after the parent


def rack_sizes(racks: int | None, per_rack: int | str | Sequence[int]) -> list[int]:
    """Workers in each rack: per_rack for every one of `racks`, or one each
    ("2,3,4" or [2, 3, 4], whose length is then the rack count). LabError in
    one line for anything else."""
    if isinstance(per_rack, str):
        try:
            per_rack = [int(x) for x in per_rack.split(",")]
        except ValueError:
            raise LabError(f"per-rack must be a count or counts like 2,3,4, not {per_rack!r}") from None
        if len(per_rack) == 1:   # one count for every rack
            per_rack = per_rack[0]
    if isinstance(per_rack, int) and not isinstance(per_rack, bool):
        sizes = [per_rack] * (1 if racks is None else racks)
    else:
        sizes = list(per_rack)
        if racks is not None and len(sizes) != racks:
            raise LabError(f"{racks} racks need one per-rack count or {racks}, not {len(sizes)}")
    if not 1 <= len(sizes) <= MAX_RACKS:
        raise LabError(f"racks must be 1..{MAX_RACKS}, not {len(sizes)}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise LabError(f"every rack needs a whole number of workers >= 1, not {sizes}")
    if sum(sizes) > MAX_WORKERS:
        raise LabError(f"a lab has at most {MAX_WORKERS} workers, not {sum(sizes)}")
    return sizes


def _subnet(host: Host) -> str:
    return f"{host.ip.rsplit('.', 1)[0]}.0/{SUBNET_PREFIXLEN}"


class RacksLab(Lab):
    """Racks of workers, each behind an uplink to a core with the parent box
    (lab.switch); a context manager like Lab:

        with RacksLab(2, 4, rate_mbit=100, uplink_rate_mbit=100) as lab:
            lab.box_of(lab.workers[5])   # rack 1's box (tree) or the parent (flat)
    """

    def __init__(self, racks: int | None, per_rack: int | str | Sequence[int],
                 layout: str = "tree", prefix: str | None = None,
                 rate_mbit: float | None = None, uplink_rate_mbit: float | None = None,
                 keep: bool = False, loss: float | str | None = None,
                 dup: float | str | None = None, queue_packets: int | None = None, burst=None):
        """racks, per_rack: rack_sizes(); layout: "tree" or "flat" (the module's
        docstring); loss, dup, burst: on every worker link and uplink, both ways;
        queue_packets: every shaped queue's depth on the bridge's side (the
        switches' ports; a host's own interface keeps a host's queue, lab/shaping.py)."""
        sizes = rack_sizes(racks, per_rack)
        if layout not in LAYOUTS:
            raise LabError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
        check_rate(uplink_rate_mbit, "uplink rate")
        check_queue(queue_packets)
        if queue_packets is not None and rate_mbit is None and uplink_rate_mbit is None:
            raise LabError("a queue depth needs a rate (the queue is the shaper's)")
        super().__init__(workers=sum(sizes), prefix=prefix, rate_mbit=rate_mbit, keep=keep,
                         loss=loss, dup=dup, burst=burst)
        self.queue_packets = queue_packets
        self.layout, self.rack_sizes, self.uplink_rate_mbit = layout, sizes, uplink_rate_mbit
        self.rack_ports = [rack_port_host(self.prefix, r) for r in range(len(sizes))]
        self.uplinks = [uplink_host(self.prefix, r) for r in range(len(sizes))]
        self.racks: list[list[Host]] = []
        for r, n in enumerate(sizes):
            first = sum(sizes[:r])
            self.racks.append([rack_worker_host(self.prefix, first + j, r, j) if layout == "tree"
                               else self.workers[first + j] for j in range(n)])
        self.workers = [w for rack in self.racks for w in rack]
        if layout == "tree":   # the rack boxes are boxes too: SwitchProcess(lab, box=1+r)
            self.switches = [self.switch, *self.rack_ports]

    # -- what the lab is made of ----------------------------------------------

    @property
    def hosts(self) -> list[Host]:
        """The parent, the rack boxes' ports, their uplinks, then the workers
        in rank order (rack by rack): every link of the lab, one each."""
        return [self.switch, *self.rack_ports, *self.uplinks, *self.workers]

    @property
    def namespaces(self) -> list[str]:
        return [self.bridge_ns, self.switch.ns, *(p.ns for p in self.rack_ports),
                *(w.ns for w in self.workers)]

    @property
    def cable_links(self) -> list[Host]:
        """The links a real rack has, which loss goes on: workers and uplinks."""
        return [*self.workers, *self.uplinks]

    def rack_of(self, worker: Host | str) -> int:
        worker = self.host(worker)
        return next(r for r, rack in enumerate(self.racks) if worker in rack)

    def box_of(self, worker: Host | str) -> Host:
        """The box `worker` joins: its rack's (tree) or the parent (flat)."""
        return self.rack_ports[self.rack_of(worker)] if self.layout == "tree" else self.switch

    def rack_box_args(self, r: int) -> list[str]:
        """`swml-switch up` options that make rack r's box a child of the parent."""
        return ["--uplink", self.uplinks[r].iface, "--parent", self.switch.ip]

    def describe(self) -> dict:
        return {**super().describe(),
                "racks": {"per_rack": self.rack_sizes, "layout": self.layout,
                          "uplink_rate_mbit": self.uplink_rate_mbit},
                "rack_ports": [dataclasses.asdict(p) for p in self.rack_ports],
                "uplinks": [dataclasses.asdict(u) for u in self.uplinks]}

    @classmethod
    def from_state(cls, prefix: str) -> RacksLab:
        """A handle on a racks lab left up by another process (keep=True)."""
        state = lifecycle.read_state(prefix)
        if state is None or "racks" not in state:
            raise LabError(f"no racks lab with prefix {prefix!r}")
        racks = state["racks"]
        lab = cls(None, racks["per_rack"], racks["layout"], prefix, state.get("rate_mbit"),
                  racks.get("uplink_rate_mbit"), keep=True, loss=state.get("loss"),
                  dup=state.get("dup"), queue_packets=state.get("queue_packets"),
                  burst=state.get("burst"))
        gone = next((ns for ns in lab.namespaces if not netns.ns_path(ns).exists()), None)
        if gone:
            raise LabError(f"racks lab {prefix} is incomplete: namespace {gone} is gone")
        lab._created, lab._started = lab.namespaces, True
        return lab

    # -- building ---------------------------------------------------------------

    def _build(self) -> None:
        lifecycle.write_state(self.prefix, self.describe())
        for ns in self.namespaces:
            self._make_namespace(ns)
        br, tree = self._ipr(self.bridge_ns), self.layout == "tree"
        self._make_bridge()   # the core
        for r in range(len(self.racks)):
            wiring.make_bridge(br, self.bridge_ns, rack_bridge(self.prefix, r), querier_ip=None)
        self._link(self.switch, self.bridge, box_qdisc=True)
        for r, (port, up) in enumerate(zip(self.rack_ports, self.uplinks)):
            self._link(port, rack_bridge(self.prefix, r), box_qdisc=tree, address=tree)
            self._link(up, self.bridge, box_qdisc=tree and self.uplink_rate_mbit is None,
                       address=tree)
        for r, rack in enumerate(self.racks):
            for w in rack:
                self._link(w, rack_bridge(self.prefix, r), box_qdisc=False)
        if tree:
            self._route()
        else:
            self._bridge_racks()
        if self.loss is None and self.dup is None and self.burst is None:
            self._attach_pass_program()
        else:
            self._loss = loss_mod.LossInjector.attach(self)
            self._loss.set(self.loss or 0.0, self.dup or 0.0, hosts=self.cable_links,
                           burst=self.burst)
        self._shape()

    def _link(self, host: Host, bridge: str, box_qdisc: bool, address: bool = True) -> None:
        wiring.make_link(self._ipr(self.bridge_ns), self._ipr(host.ns), self.bridge_ns, bridge,
                         host, box_qdisc=box_qdisc, address=address)

    def _route(self) -> None:
        """Tree: every rack box a router between its rack and the core; each
        worker's way out through its rack box, the parent's to each rack
        through that rack's uplink."""
        for r, (port, up) in enumerate(zip(self.rack_ports, self.uplinks)):
            netns.write_sysctl(port.ns, "net.ipv4.ip_forward", "1")
            ipr = self._ipr(port.ns)
            for q, (other, other_up) in enumerate(zip(self.rack_ports, self.uplinks)):
                if q != r:
                    ipr.route("add", dst=_subnet(other), gateway=other_up.ip)
            self._ipr(self.switch.ns).route("add", dst=_subnet(port), gateway=up.ip)
            for w in self.racks[r]:
                self._ipr(w.ns).route("add", dst="0.0.0.0/0", gateway=port.ip)

    def _bridge_racks(self) -> None:
        """Flat: each rack box's namespace bridges its port and its uplink."""
        for r, (port, up) in enumerate(zip(self.rack_ports, self.uplinks)):
            ipr, bridge = self._ipr(port.ns), f"{self.prefix}-rs{r}"
            wiring.make_bridge(ipr, port.ns, bridge, querier_ip=None)
            b = net.link_index(bridge, port.ns)
            for end in (port, up):
                ipr.link("set", index=net.link_index(end.iface, port.ns), master=b)

    def _attach_pass_program(self) -> None:
        try:
            self._pass = bpf.compile_program(wiring.PASS_SOURCE, wiring.PASS_PROG)
            wiring.attach_pass_program(self._pass, self.bridge_ns, self.hosts, self.switches,
                                       multicast=True)
        except bpf.BpfError as e:
            raise LabError(f"cannot attach the lab's pass program: {e}") from e

    def _shape(self) -> None:
        """The module's docstring, "Shaping"."""
        br, q = self._ipr(self.bridge_ns), self.queue_packets
        rate, up_rate = self.rate_mbit, self.uplink_rate_mbit
        if rate is not None:
            for w in self.workers:
                shape(self._ipr(w.ns), net.link_index(w.iface, w.ns), rate, host_queue(q))
                shape(br, net.link_index(w.peer, self.bridge_ns), rate, q)
            for port, rack in zip(self.rack_ports, self.racks):
                shape_per_source(br, net.link_index(port.peer, self.bridge_ns), rate,
                                 [w.ip for w in rack], q)
        if up_rate is None:
            return
        for up in self.uplinks:
            shape(br, net.link_index(up.peer, self.bridge_ns), up_rate, q)
            shape(self._ipr(up.ns), net.link_index(up.iface, up.ns), up_rate,
                  HOST_QUEUE_PACKETS)
        if self.layout == "tree":
            shape_per_source(br, net.link_index(self.switch.peer, self.bridge_ns), up_rate,
                             [u.ip for u in self.uplinks], q)


def switches_of_the_racks(stack: contextlib.ExitStack, lab: RacksLab,
                          args: Sequence[str] = ()) -> list:
    """`swml-switch up ARGS` on the parent and, tree, on every rack box as its
    child (each a cluster.SwitchProcess, stopped when `stack` closes)."""
    from .cluster import SwitchProcess

    boxes = range(len(lab.racks)) if lab.layout == "tree" else ()
    return [stack.enter_context(SwitchProcess(lab, list(args))),
            *(stack.enter_context(SwitchProcess(lab, [*args, *lab.rack_box_args(r)], box=1 + r))
              for r in boxes)]


def open_lab(prefix: str) -> Lab:
    """The lab left up with `prefix`, a RacksLab if it is one."""
    state = lifecycle.read_state(prefix)
    return RacksLab.from_state(prefix) if state and "racks" in state else Lab.from_state(prefix)
