"""Attach, find and detach a tc BPF program on an interface's ingress (a
direct-action `bpf` filter under a clsact qdisc), in this network namespace or
a named one. Used by the switch's unicast fan-out (xdp/swml_fanout.c), and
by the lab's queue steering and loss injector and the bench's TCP dropper,
which attach at priorities of their own (and on egress) beside each other.

Like the switch's XDP program (xdp.py `attach`), the filter stays until
someone removes it, so that it outlives a crashed daemon with the XDP program
it works with; `tc_detach` removes it (and the clsact qdisc, when nothing else
hangs under it). The filter sits at a priority of its own (TC_PRIO), so it
is found and replaced without touching other filters.

pyroute2 is imported by the calls that need it: importing the door must not.
"""
from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os
from dataclasses import dataclass

from .. import net
from . import libbpf
from .errors import BpfError

TC_H_CLSACT = 0xFFFFFFF1
TC_H_INGRESS = 0xFFFFFFF2     # TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)
TC_H_EGRESS = 0xFFFFFFF3
TC_PRIO = 0xBEE0              # the filter's priority: SwitchML's port, out of the common range
TC_HANDLE = 1


class TcError(BpfError):
    """A tc program could not be attached to, found on or removed from an interface."""


@dataclass(frozen=True)
class TcFilter:
    """The filter at TC_PRIO. Only its program's name: the pyroute2 of Debian 12
    (0.7.2) does not decode the program id that the kernel reports with it."""
    name: str


def _ipr(netns: str | None):
    """A netlink socket in `netns` (moved there only for its creation)."""
    from pyroute2 import IPRoute

    if netns is not None and not (net.NETNS_DIR / netns).exists():
        raise TcError(f"no network namespace named {netns!r}")
    with net.in_netns(netns):
        return IPRoute()


def _index(iface: str, netns: str | None) -> int:
    try:
        return net.link_index(iface, netns)
    except net.NetError as e:
        raise TcError(str(e)) from None


def _ours(msg, prio: int = TC_PRIO) -> TcFilter | None:
    """The bpf filter at `prio` described by a filter dump message, or None."""
    if msg.get_attr("TCA_KIND") != "bpf" or (msg["info"] >> 16) != prio:
        return None
    opts = msg.get_attr("TCA_OPTIONS")
    if opts is None:   # the filter's chain head, one a priority: no program
        return None
    return TcFilter(opts.get_attr("TCA_BPF_NAME") or "")


def tc_attach(iface: str, prog_fd: int, name: str, *, netns: str | None = None,
              egress: bool = False, prio: int = TC_PRIO) -> int:
    """Put program `prog_fd` (loaded as sched_cls) on `iface`'s ingress (or
    egress), in place of what sits at `prio` there (atomically: no frame
    misses both); filters at other priorities stay, the lower number first.
    Makes the clsact qdisc where there is none. Returns the program's id."""
    from pyroute2.netlink.exceptions import NetlinkError

    parent = TC_H_EGRESS if egress else TC_H_INGRESS
    index = _index(iface, netns)
    with contextlib.closing(_ipr(netns)) as ipr:
        try:
            try:
                ipr.tc("add", "clsact", index)
            except NetlinkError as e:
                if e.code != errno.EEXIST:
                    raise
            ipr.tc("replace-filter", "bpf", index, handle=TC_HANDLE, prio=prio, fd=prog_fd,
                   name=name, parent=parent, direct_action=True)
            found = [f for f in (_ours(m, prio) for m in ipr.get_filters(index=index, parent=parent))
                     if f]
        except NetlinkError as e:
            raise TcError(f"cannot attach tc program {name} to {iface} "
                          f"{'egress' if egress else 'ingress'}: "
                          f"{e.args[1] if len(e.args) > 1 else e}") from None
    if not found:
        raise TcError(f"tc program {name} on {iface} {'egress' if egress else 'ingress'}: "
                      "attached, but not listed after")
    return prog_id_of(prog_fd)


def prog_id_of(prog_fd: int) -> int:
    """The id of the program behind `prog_fd` (struct bpf_prog_info: type, id)."""
    info = (ct.c_uint32 * 2)()
    size = ct.c_uint32(ct.sizeof(info))
    err = libbpf.lib().bpf_obj_get_info_by_fd(prog_fd, info, ct.byref(size))
    if err < 0:
        raise TcError(f"cannot read the info of program fd {prog_fd}: {os.strerror(-err)}")
    return info[1]


def tc_attachment(iface: str, *, netns: str | None = None, egress: bool = False,
                  prio: int = TC_PRIO) -> TcFilter | None:
    """The program at `prio` on `iface`'s ingress (or egress), or None."""
    from pyroute2.netlink.exceptions import NetlinkError

    index = _index(iface, netns)
    with contextlib.closing(_ipr(netns)) as ipr:
        try:
            msgs = ipr.get_filters(index=index, parent=TC_H_EGRESS if egress else TC_H_INGRESS)
        except NetlinkError as e:
            if e.code in (errno.EINVAL, errno.ENOENT):   # no clsact qdisc
                return None
            raise TcError(f"cannot list tc filters of {iface}: {e}") from None
    found = [f for f in (_ours(m, prio) for m in msgs) if f]
    return found[0] if found else None


def tc_detach(iface: str, *, netns: str | None = None, name: str | None = None,
              egress: bool = False, prio: int = TC_PRIO) -> bool:
    """Remove the filter at `prio` from `iface`'s ingress (or egress; with
    `name`, only if its program has that name), then the clsact qdisc if no
    filter is left under it. Returns whether a filter was removed."""
    from pyroute2.netlink.exceptions import NetlinkError

    current = tc_attachment(iface, netns=netns, egress=egress, prio=prio)
    if current is None or (name is not None and current.name != name):
        return False
    index = _index(iface, netns)
    with contextlib.closing(_ipr(netns)) as ipr:
        try:
            ipr.tc("del-filter", "bpf", index, handle=TC_HANDLE, prio=prio,
                   parent=TC_H_EGRESS if egress else TC_H_INGRESS)
        except NetlinkError as e:
            if e.code != errno.ENOENT:
                raise TcError(f"cannot remove tc program {current.name} from {iface}: "
                              f"{e}") from None
        with contextlib.suppress(NetlinkError):
            left = [m for parent in (TC_H_INGRESS, TC_H_EGRESS)
                    for m in ipr.get_filters(index=index, parent=parent)
                    if m.get_attr("TCA_KIND")]
            if not left:
                ipr.tc("del", "clsact", index)
    return True
