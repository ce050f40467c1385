"""Interface lookups by name, and entering a named network namespace.

One place for what the switch, the worker, the lab and the door each need to
know about a link: its index, MAC and IPv4 address, and the route to a peer.
Failures raise NetError with a one-line reason.

A network namespace is a per-thread attribute in Linux: `in_netns` moves the
calling thread only (setns(2)), so several threads can sit in different
namespaces at once. Sockets (netlink ones included) stay in the namespace they
were created in.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
from collections.abc import Iterator
from pathlib import Path

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


class NetError(RuntimeError):
    """An interface, address or route that is not there; the message is one line."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns(CLONE_NEWNET) failed: {os.strerror(err)}")


@contextlib.contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Move the calling thread (only it) into namespace `name` (one `ip netns`
    sees); back on exit. None: stay where the thread is.

    The way back is an fd on the thread's own namespace taken before leaving,
    so nesting works and other threads are never affected.
    """
    if name is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(NETNS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        os.close(home)
        raise FileNotFoundError(errno.ENOENT, "no such network namespace", name) from None
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def _where(netns: str | None) -> str:
    return f"network namespace {netns}" if netns else "this network namespace"


def link_index(iface: str, netns: str | None = None) -> int:
    """The ifindex of `iface` (in namespace `netns`, else the calling thread's)."""
    try:
        with in_netns(netns):
            return socket.if_nametoindex(iface)
    except FileNotFoundError as e:
        raise NetError(f"no network namespace named {netns!r}") from e
    except OSError:
        raise NetError(f"no interface named {iface!r} in {_where(netns)}") from None


@contextlib.contextmanager
def _link(iface: str, netns: str | None):
    """(IPRoute, ifindex) for `iface`, the netlink socket made inside `netns`."""
    from pyroute2 import IPRoute  # late: `import switchml_xdp.net` needs no pyroute2

    index = link_index(iface, netns)
    with in_netns(netns):
        ipr = IPRoute()
    with ipr:
        yield ipr, index


def link_mac(iface: str, netns: str | None = None) -> str:
    """The MAC address of `iface`, as "aa:bb:cc:dd:ee:ff"."""
    with _link(iface, netns) as (ipr, index):
        return ipr.get_links(index)[0].get_attr("IFLA_ADDRESS")


def link_master(iface: str, netns: str | None = None) -> str | None:
    """The name of the device `iface` is enslaved to (its bridge), or None."""
    with _link(iface, netns) as (ipr, index):
        master = ipr.get_links(index)[0].get_attr("IFLA_MASTER")
        return ipr.get_links(master)[0].get_attr("IFLA_IFNAME") if master else None


def link_mtu(iface: str, netns: str | None = None) -> int:
    """The MTU of `iface`: the largest IPv4 datagram it sends unfragmented."""
    with _link(iface, netns) as (ipr, index):
        return ipr.get_links(index)[0].get_attr("IFLA_MTU")


def link_has_carrier(iface: str, netns: str | None = None) -> bool:
    """Whether `iface` is up with a carrier: frames it sends reach the wire."""
    with _link(iface, netns) as (ipr, index):
        link = ipr.get_links(index)[0]
    return link.get_attr("IFLA_CARRIER") == 1 and link.get_attr("IFLA_OPERSTATE") in ("UP", "UNKNOWN")


# pyroute2's names for IFLA_XDP_ATTACHED's values (XDP_ATTACHED_*), back to them
_XDP_ATTACHED = {"xdp": 1, "xdpgeneric": 2, "xdpoffload": 3, "xdpmulti": 4}


def link_xdp(iface: str, netns: str | None = None) -> tuple[int, int]:
    """(XDP_ATTACHED_* mode, program id) of what is attached to `iface`, as
    rtnetlink reports it (IFLA_XDP); (0, 0) for nothing. For hosts without
    libbpf (bpf/xdp.py, attachment)."""
    with _link(iface, netns) as (ipr, index):
        xdp = ipr.get_links(index)[0].get_attr("IFLA_XDP")
    if xdp is None:
        return 0, 0
    return (_XDP_ATTACHED.get(xdp.get_attr("IFLA_XDP_ATTACHED"), 0),
            xdp.get_attr("IFLA_XDP_PROG_ID") or 0)


def link_ipv4(iface: str, netns: str | None = None) -> str:
    """The (first) IPv4 address of `iface`; NetError if it has none."""
    with _link(iface, netns) as (ipr, index):
        addrs = ipr.get_addr(index=index, family=socket.AF_INET)
    if not addrs:
        raise NetError(f"{iface} has no IPv4 address")
    return addrs[0].get_attr("IFA_ADDRESS")


def set_features(iface: str, features: dict[str, bool], netns: str | None = None) -> None:
    """Switch ethtool features ("tx-vlan-hw-insert": False, ...) of `iface`."""
    from pyroute2.ethtool import Ethtool

    link_index(iface, netns)  # a clear error for a missing interface
    with in_netns(netns):
        et = Ethtool()
    try:
        current = et.get_features(iface)
        for name, on in features.items():
            current.features[name].enable = on
        et.set_features(iface, current)
    except Exception as e:  # noqa: BLE001 - pyroute2 raises assorted types for unsupported features
        raise NetError(f"cannot set {', '.join(features)} on {iface}: {e}") from None
    finally:
        et.close()


def route_to(dst: str, port: int = 9) -> tuple[str, str]:
    """(local IPv4, interface) the kernel would use to reach `dst` (at `port`,
    for policy routing; nothing is sent)."""
    from pyroute2 import IPRoute

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((dst, port))
        except OSError as e:
            raise NetError(f"no route to {dst}: {e.strerror}") from None
        local_ip = s.getsockname()[0]
    with IPRoute() as ipr:
        oif = ipr.route("get", dst=dst)[0].get_attr("RTA_OIF")
        iface = ipr.get_links(oif)[0].get_attr("IFLA_IFNAME")
    return local_ip, iface


def next_hop_mac(dst: str, iface: str, netns: str | None = None) -> str:
    """The MAC of the next hop towards `dst` out of `iface` (`dst` itself, or
    its gateway), as the neighbour table has it: something must have spoken
    to it lately (a TCP connection resolves it). NetError if it is not known."""
    with _link(iface, netns) as (ipr, index):
        routes = ipr.route("get", dst=dst)
        gateway = routes[0].get_attr("RTA_GATEWAY") if routes else None
        hop = gateway or dst
        for n in ipr.get_neighbours(ifindex=index, family=socket.AF_INET):
            mac = n.get_attr("NDA_LLADDR")
            if n.get_attr("NDA_DST") == hop and mac:
                return mac
    raise NetError(f"no neighbour entry for {hop} on {iface}: the next hop towards {dst} "
                   f"is not resolved")
