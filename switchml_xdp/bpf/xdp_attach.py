"""Attach, detach and inspect XDP programs on an interface.

Attaching goes through bcc (its netlink call gets the flags right); reading the
attachment state goes through pyroute2.
"""
from __future__ import annotations

import ctypes as ct
import os
from dataclasses import dataclass

from bcc.libbcc import lib
from pyroute2 import IPRoute

XDP_FLAGS_UPDATE_IF_NOEXIST = 1 << 0
XDP_FLAGS_SKB_MODE = 1 << 1  # generic XDP
XDP_FLAGS_DRV_MODE = 1 << 2  # native XDP

MODES = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE}


class XdpError(RuntimeError):
    pass


@dataclass(frozen=True)
class Attachment:
    mode: str | None  # "native", "generic", "offload", None when nothing attached
    prog_id: int


def ifindex(iface: str) -> int:
    with IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=iface)
    if not idx:
        raise XdpError(f"no interface named {iface!r} in this network namespace")
    return idx[0]


def attachment(iface: str) -> Attachment:
    with IPRoute() as ipr:
        links = ipr.get_links(ifindex(iface))
    xdp = links[0].get_attr("IFLA_XDP") if links else None
    if not xdp:
        return Attachment(None, 0)
    mode = {"xdp": "native", "xdpgeneric": "generic", "xdpoffload": "offload",
            "xdpmulti": "multi"}.get(xdp.get_attr("IFLA_XDP_ATTACHED"))
    return Attachment(mode, xdp.get_attr("IFLA_XDP_PROG_ID") or 0)


def attach(iface: str, prog_fd: int, mode: str, replace: bool = False) -> None:
    """Attach in `mode` ("native" or "generic"). Unless `replace`, refuse to
    displace a program someone else attached."""
    flags = MODES[mode] | (0 if replace else XDP_FLAGS_UPDATE_IF_NOEXIST)
    if lib.bpf_attach_xdp(iface.encode(), prog_fd, flags) < 0:
        err = ct.get_errno()
        raise XdpError(f"cannot attach XDP ({mode}) to {iface}: {os.strerror(err)}")


def detach(iface: str) -> None:
    att = attachment(iface)
    if att.mode is None:
        return
    flags = MODES.get(att.mode, 0)
    if lib.bpf_attach_xdp(iface.encode(), -1, flags) < 0:
        err = ct.get_errno()
        raise XdpError(f"cannot detach XDP from {iface}: {os.strerror(err)}")
