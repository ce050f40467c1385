"""The VM lab's network: a bridge and one multi-queue tap per VM, all inside a
network namespace of the run's own, so nothing shows up in the host's
namespace and removing that namespace removes them all.

The bridge snoops IGMP and runs a querier (lab/igmp.py), as real switches and
the networks of clouds that carry multicast do: a guest gets the switch's
result group only if its kernel joined it. Each tap is made persistent with IFF_MULTI_QUEUE before
qemu starts (in the same namespace), so qemu's `queues=N` opens N queues on it
and the guest's virtio-net gets N queue pairs.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from .. import net
from . import igmp, netns
from .addressing import SUBNET_PREFIXLEN, SWITCH_IP, WORKER_IP_BASE


@dataclasses.dataclass(frozen=True)
class VmHost:
    """One VM on the lab network: "sw" or "w<rank>"."""
    name: str
    tap: str
    ip: str
    mac: str
    queues: int


def vm_host(prefix: str, name: str, queues: int) -> VmHost:
    if name == "sw":
        ip, group, index = SWITCH_IP, 0, 1
    else:
        rank = int(name[1:])
        ip, group, index = f"10.0.0.{WORKER_IP_BASE + rank}", 1, rank
    # 52:54:00 is qemu's own prefix; the rest reads as switch/worker and index.
    return VmHost(name, f"{prefix}-t{name}", ip, f"52:54:00:5d:{group:02x}:{index:02x}", queues)


class VmNetwork:
    """Namespace `<prefix>-net` with bridge `<prefix>-br` (MTU `mtu`) and taps."""

    def __init__(self, prefix: str, mtu: int):
        self.ns = f"{prefix}-net"
        self.bridge = f"{prefix}-br"
        self.mtu = mtu
        self._made = False

    def create(self) -> None:
        netns.create_netns(self.ns)
        self._made = True
        for conf in ("all", "default"):
            netns.write_sysctl(self.ns, f"net.ipv6.conf.{conf}.disable_ipv6", "1")
        with contextlib.closing(netns.iproute_in(self.ns)) as ipr:
            ipr.link("set", index=net.link_index("lo", self.ns), state="up")
            ipr.link("add", ifname=self.bridge, kind="bridge", **igmp.snooping_bridge_attrs())
            index = net.link_index(self.bridge, self.ns)
            ipr.link("set", index=index, mtu=self.mtu, state="up")
            igmp.start_querier(ipr, index, SWITCH_IP, SUBNET_PREFIXLEN)
        # Bridged VM-to-VM frames are not the host firewall's business (see namespace_lab.py).
        for family in ("iptables", "ip6tables", "arptables"):
            key = f"net.bridge.bridge-nf-call-{family}"
            if (Path("/proc/sys") / key.replace(".", "/")).exists():
                netns.write_sysctl(self.ns, key, "0")

    def add_tap(self, host: VmHost) -> None:
        """A persistent multi-queue tap on the bridge, for qemu to open."""
        netns.run_in(self.ns, ["ip", "tuntap", "add", "dev", host.tap, "mode", "tap", "multi_queue"],
                     capture_output=True, text=True)
        with contextlib.closing(netns.iproute_in(self.ns)) as ipr:
            ipr.link("set", index=net.link_index(host.tap, self.ns), mtu=self.mtu,
                     master=net.link_index(self.bridge, self.ns), state="up")

    def remove(self) -> None:
        """Stop whatever still runs inside, then drop the namespace (and with it
        the bridge and the taps). Idempotent."""
        if not self._made:
            return
        netns.terminate_pids(netns.pids_in([self.ns]))
        netns.remove_netns(self.ns)
        self._made = False
