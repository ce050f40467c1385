"""Attach, detach and inspect XDP programs on an interface, in this network
namespace or a named one.

Two ways to attach, for two lifetimes:

* `attach`: netlink (libbpf's bpf_xdp_attach), with explicit mode flags. The
  program stays until someone detaches it: the switch, whose data plane must
  outlive a crashed daemon so a new one can adopt it.
* `attach_link`: a BPF link. The program stays exactly as long as the link's
  fd is open, so a worker that dies (even SIGKILL) never leaves its program.

Mode None means native XDP, falling back to generic with one line on stderr;
that fallback lives here only (`_with_fallback`). `netns` moves the calling
thread (only it) into that namespace for the call: libbpf's netlink socket and
the interface lookup then happen there.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import sys
from dataclasses import dataclass

from .. import net
from . import libbpf
from .errors import BpfError, XdpError

MODE_FLAGS = {"native": libbpf.XDP_FLAGS_DRV_MODE, "generic": libbpf.XDP_FLAGS_SKB_MODE}


@dataclass(frozen=True)
class Attachment:
    mode: str | None   # "native", "generic", "offload", "multi"; None: nothing attached
    prog_id: int


def _inside(netns: str | None):
    """net.in_netns, with a missing namespace as an XdpError."""
    if netns is not None and not (net.NETNS_DIR / netns).exists():
        raise XdpError(f"no network namespace named {netns!r}")
    return net.in_netns(netns)


def _ifindex(iface: str) -> int:
    """The index of `iface` in the calling thread's namespace."""
    try:
        return net.link_index(iface)
    except net.NetError as e:
        raise XdpError(str(e)) from None


def _modes_to_try(mode: str | None) -> list[str]:
    if mode is None:
        return ["native", "generic"]
    if mode not in MODE_FLAGS:
        raise XdpError(f"XDP mode must be 'native' or 'generic', not {mode!r}")
    return [mode]


def _with_fallback(iface: str, mode: str | None, attach_one, quiet: bool) -> str:
    """Run attach_one(mode) for the requested mode, or native then generic."""
    modes = _modes_to_try(mode)
    for i, m in enumerate(modes):
        try:
            attach_one(m)
            return m
        except OSError as e:
            if i + 1 == len(modes):
                raise XdpError(f"cannot attach XDP ({m}) to {iface}: {e.strerror}") from None
            if not quiet:
                print(f"switchml-xdp: native XDP unavailable on {iface} ({e.strerror}); "
                      "using generic XDP", file=sys.stderr)
    raise AssertionError("unreachable")


def attach(iface: str, prog_fd: int, mode: str | None = None, *, replace: bool = False,
           netns: str | None = None, quiet: bool = False) -> str:
    """Attach `prog_fd` to `iface`; returns the mode in use. Unless `replace`,
    refuse to displace a program someone else attached (EBUSY). `quiet`: no
    line on stderr when falling back to generic."""
    lib = libbpf.lib()
    keep = 0 if replace else libbpf.XDP_FLAGS_UPDATE_IF_NOEXIST

    def attach_one(m: str) -> None:
        with _inside(netns):
            index = _ifindex(iface)
            libbpf.check(lib.bpf_xdp_attach(index, prog_fd, MODE_FLAGS[m] | keep, None))

    return _with_fallback(iface, mode, attach_one, quiet)


class XdpLink:
    """An XDP program attached through a BPF link; close() detaches it."""

    def __init__(self, fd: int, mode: str):
        self.fd, self.mode = fd, mode

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> XdpLink:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def attach_link(iface: str, prog_fd: int, mode: str | None = None, *,
                netns: str | None = None, quiet: bool = False) -> XdpLink:
    """Attach `prog_fd` to `iface` through a BPF link (see the module's doc)."""
    lib = libbpf.lib()
    fds = []

    def attach_one(m: str) -> None:
        with _inside(netns):
            index = _ifindex(iface)
            o = libbpf.opts(libbpf.LinkCreateOpts, flags=MODE_FLAGS[m])
            fds.append(libbpf.check(lib.bpf_link_create(prog_fd, index, libbpf.BPF_XDP,
                                                        ct.byref(o))))

    used = _with_fallback(iface, mode, attach_one, quiet)
    return XdpLink(fds[-1], used)


def attachment(iface: str, *, netns: str | None = None) -> Attachment:
    """What is attached to `iface` now. Where libbpf is missing (a host
    that only runs the user-space switch), rtnetlink tells the same."""
    try:
        lib = libbpf.lib()
    except BpfError:
        try:
            mode, prog_id = net.link_xdp(iface, netns)
        except net.NetError as e:
            raise XdpError(str(e)) from None
        return Attachment(libbpf.ATTACHED_MODES.get(mode), prog_id)
    q = libbpf.opts(libbpf.XdpQueryOpts)
    with _inside(netns):
        index = _ifindex(iface)
        err = lib.bpf_xdp_query(index, 0, ct.byref(q))
    if err < 0:
        raise XdpError(f"cannot query XDP on {iface}: {os.strerror(-err)}")
    return Attachment(libbpf.ATTACHED_MODES.get(q.attach_mode), q.prog_id)


def detach(iface: str, *, netns: str | None = None, prog_id: int | None = None) -> bool:
    """Detach what is attached to `iface` through netlink; with `prog_id`, only
    if that is the program attached (checked atomically by the kernel).
    Returns whether a program was detached."""
    lib = libbpf.lib()
    with _inside(netns):
        att = attachment(iface)
        if att.mode is None or (prog_id is not None and att.prog_id != prog_id):
            return False
        flags = MODE_FLAGS.get(att.mode, 0)
        old_fd = -1
        if prog_id is not None:
            old_fd = lib.bpf_prog_get_fd_by_id(prog_id)
            if old_fd < 0:  # gone since the query
                return False
        try:
            o = libbpf.opts(libbpf.XdpAttachOpts, old_prog_fd=max(old_fd, 0))
            err = lib.bpf_xdp_detach(_ifindex(iface), flags, ct.byref(o))
        finally:
            if old_fd >= 0:
                os.close(old_fd)
    if err == -errno.EEXIST and prog_id is not None:  # replaced by another in between
        return False
    if err < 0:
        raise XdpError(f"cannot detach XDP from {iface}: {os.strerror(-err)}")
    return True

