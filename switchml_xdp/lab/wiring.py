"""What a lab is built of, step by step: quiet namespaces, the bridge, one veth
link a host (boxes and workers alike), and the XDP pass program on the
bridge side of every link. Lab
(lab/namespace_lab.py) calls these in order and undoes them; each takes the
netlink sockets it works through (pyroute2 IPRoute, one a namespace).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from pyroute2 import IPRoute

from .. import bpf, net, wire
from . import igmp, netns
from .addressing import SUBNET_PREFIXLEN, Host, bridge_mac, peer_mac
from .errors import LabError

PASS_SOURCE = "lab/swml_pass.c"
PASS_PROG = "swml_pass"
NO_MULTICAST_PROG = "swml_pass_no_multicast"   # in PASS_SOURCE too
# The switch's own interface gets a qdisc, as a real NIC has (veth's default
# is none): what the stack sends there (the unicast fan-out's copies, above
# all) then waits when the peer's 256-frame ring is full, where without one
# veth drops it. XDP_TX'd frames never pass a qdisc.
SWITCH_QDISC_HANDLE = 0x10000    # 1:
# A host's own egress queue (a worker's, a box's): Linux's default txqueuelen.
# Every host interface the lab shapes keeps it, whatever a switch port's
# buffer (--queue) is (lab/shaping.py).
HOST_QUEUE_PACKETS = 1000


def quiet_namespace(ns: str, ipr: IPRoute) -> None:
    """A new namespace made quiet: IPv6 off (no router/neighbour solicitations,
    no MLD in captures), loopback up. Set before any veth moves in, so
    `default` covers them."""
    for conf in ("all", "default"):
        netns.write_sysctl(ns, f"net.ipv6.conf.{conf}.disable_ipv6", "1")
    ipr.link("set", index=net.link_index("lo", ns), state="up")


def make_bridge(ipr: IPRoute, ns: str, bridge: str, querier_ip: str | None,
                query_interval_s: float = igmp.QUERY_INTERVAL_S,
                querier_links: tuple[str, str, str] | None = None) -> None:
    """The bridge `bridge` in namespace `ns`, multicast snooping off: no IGMP
    querier here, and with snooping on the bridge would stop flooding the
    switch's result group once its timers expire. Off, multicast floods to
    every port like broadcast. With a querier_ip (Lab(igmp=True)): snooping,
    and a querier on an uplink (querier_links: addressing.querier_links)
    asking every query_interval_s from querier_ip's subnet (lab/igmp.py)."""
    mcast = (igmp.snooping_bridge_attrs(query_interval_s) if querier_ip
             else {"br_mcast_snooping": 0})
    ipr.link("add", ifname=bridge, kind="bridge", **mcast)
    # A real switch port does not run the IP stack's checks or iptables on
    # what it forwards; br_netfilter (built into kernels like this one) would
    # drop malformed frames the tests send on purpose, and cost CPU.
    for family in ("iptables", "ip6tables", "arptables"):
        key = f"net.bridge.bridge-nf-call-{family}"
        if (Path("/proc/sys") / key.replace(".", "/")).exists():
            netns.write_sysctl(ns, key, "0")
    ipr.link("set", index=net.link_index(bridge, ns), address=bridge_mac(), state="up")
    if querier_ip:
        if querier_links is None:
            raise ValueError("a snooping bridge needs querier_links")
        igmp.add_uplink_querier(ipr, ns, bridge, querier_links, querier_ip, SUBNET_PREFIXLEN,
                                query_interval_s)


def check_link_queues(queues: int) -> int:
    """Queues a lab link may have (Lab(link_queues=Q)): 1..wire.MAX_LANES."""
    if not isinstance(queues, int) or not 1 <= queues <= wire.MAX_LANES:
        raise LabError(f"link queues must be an integer in 1..{wire.MAX_LANES}, got {queues!r}")
    return queues


def make_link(br: IPRoute, ipr: IPRoute, bridge_ns: str, bridge: str, host: Host, *,
              box_qdisc: bool, address: bool = True, queues: int = 1) -> None:
    """Veth from the bridge namespace straight into the host's (`br` and `ipr`
    their sockets): the pair never shows up in the namespace this process
    runs in. With box_qdisc (a box whose link is not shaped: a shaped one
    gets its shaper's queue, lab/shaping.py), the host's end gets a qdisc
    (HOST_QUEUE_PACKETS). address=False: the host's end gets no IP (a
    port of the box's bridge, lab/box_ports.py). queues: each end's tx and
    rx queues; above 1, a frame's queue is its flow's hash (or, for XDP_TX
    and redirects, its CPU's; a UDP frame's the bridge steers by its port:
    lab/steering.py), so a worker's lanes go through the veths in parallel,
    one NAPI each, as a NIC's queues would take them."""
    fd = netns.netns_fd(host.ns)
    try:
        br.link("add", ifname=host.peer, kind="veth", num_tx_queues=queues, num_rx_queues=queues,
                peer={"ifname": host.iface, "net_ns_fd": fd, "num_tx_queues": queues,
                      "num_rx_queues": queues})
    finally:
        os.close(fd)
    br.link("set", index=net.link_index(host.peer, bridge_ns), address=peer_mac(host),
            master=net.link_index(bridge, bridge_ns), state="up")
    # A VLAN tag crossing the bridge stays in the frame, as on a wire: with
    # veth's tag insertion offloaded it would travel beside the frame, and
    # the receiver's XDP program would see a tagged frame untagged.
    net.set_features(host.peer, {"tx-vlan-hw-insert": False}, bridge_ns)
    i = net.link_index(host.iface, host.ns)
    ipr.link("set", index=i, address=host.mac)
    if address:
        ipr.addr("add", index=i, address=host.ip, prefixlen=SUBNET_PREFIXLEN)
    ipr.link("set", index=i, state="up")
    if box_qdisc:
        ipr.tc("add", "pfifo", i, SWITCH_QDISC_HANDLE, limit=HOST_QUEUE_PACKETS)


# Which bridge ports carry the pass program (Lab(port_hooks=...)). A veth
# port with an XDP program takes every frame through veth's XDP path: an skb
# with less than XDP_PACKET_HEADROOM in front, or a clone, is copied into a
# fresh page first, and the veth in front of it can no longer hand it GSO
# skbs, so a TCP sender's 64 KB segments are cut to MTU-sized frames at its
# own port. "every": every host's port (the lab as its figures so far were
# measured). "boxes": the boxes' ports alone, the only ones an XDP program
# sends into (XDP_TX, the reflector); the workers' frames cross the bridge as
# their stack made them, as a hardware switch would take them.
PORT_HOOKS = ("every", "boxes")


def check_port_hooks(hooks: str) -> str:
    if hooks not in PORT_HOOKS:
        raise LabError(f"port hooks {hooks!r}: one of {', '.join(PORT_HOOKS)}")
    return hooks


def attach_pass_program(prog: bpf.Program, bridge_ns: str, hosts: list[Host],
                        switches: Sequence[Host], multicast: bool,
                        boxes_only: bool = False) -> None:
    """Attach xdp/lab/swml_pass.c (`prog`, compiled from PASS_SOURCE), native,
    to the bridge side of every host's link (boxes_only: of the boxes'
    links, `switches`, alone: PORT_HOOKS); on every box's, without
    multicast, its variant that drops the box's multicast."""
    no_multicast = None if multicast else prog.load(NO_MULTICAST_PROG)
    for host in hosts:
        if boxes_only and host not in switches:
            continue
        fd = no_multicast if host in switches and no_multicast else prog.fd
        bpf.attach(host.peer, fd, "native", netns=bridge_ns)
