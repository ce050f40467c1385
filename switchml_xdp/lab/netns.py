"""Running things inside named network namespaces (the ones `ip netns` sees).

Two ways in, for two needs:

* processes: `nsenter --net=/run/netns/NAME`. Not `ip netns exec`, which also
  unshares the mount namespace and remounts /sys, hiding the bpffs at
  /sys/fs/bpf, where the switch pins its maps.
* the calling thread: `setns(2)` on that thread only (`in_netns`). A network
  namespace is a per-thread attribute in Linux, so several Python threads can
  each sit in a different namespace at once, e.g. one per emulated worker.
  Sockets (netlink ones included) stay in the namespace they were created in,
  which is how `iproute_in` gets an IPRoute that talks to a namespace without
  forking.
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2 import netns as _pr_netns

from ..net import NETNS_DIR, in_netns


def ns_path(name: str) -> Path:
    """The bind mount that keeps namespace `name` alive (iproute2's convention)."""
    return NETNS_DIR / name


def list_netns() -> list[str]:
    """Names of the named network namespaces, sorted."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir())
    except FileNotFoundError:
        return []


def create_netns(name: str) -> None:
    """Create a named namespace; fails if one of that name exists."""
    if ns_path(name).exists():
        raise FileExistsError(errno.EEXIST, "network namespace exists", name)
    _pr_netns.create(name)


def remove_netns(name: str) -> bool:
    """Unmount and unlink namespace `name`; False if it was not there.

    The namespace itself (and the interfaces in it) goes away when nothing else
    holds it: no process inside, no open fd, no socket created in it.
    """
    if not ns_path(name).exists():
        return False
    _pr_netns.remove(name)
    return True


def iproute_in(name: str) -> IPRoute:
    """An IPRoute whose netlink socket lives in namespace `name` (caller closes it)."""
    with in_netns(name):
        return IPRoute()


def netns_fd(name: str) -> int:
    """An O_CLOEXEC fd on namespace `name`, e.g. for IFLA_NET_NS_FD (caller closes it)."""
    return os.open(ns_path(name), os.O_RDONLY | os.O_CLOEXEC)


def write_sysctl(name: str, key: str, value: str) -> None:
    """Set a net.* sysctl of namespace `name`.

    /proc/sys/net resolves to the namespace of the thread that opens the file,
    so opening it while inside is enough.
    """
    path = Path("/proc/sys") / key.replace(".", "/")
    with in_netns(name):
        path.write_text(value)


def nsenter_argv(name: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs argv inside namespace `name` (network only)."""
    return ["nsenter", f"--net={ns_path(name)}", "--", *map(str, argv)]


def popen_in(name: str, argv: Sequence[str], **kw) -> subprocess.Popen:
    """subprocess.Popen of argv inside namespace `name`."""
    return subprocess.Popen(nsenter_argv(name, argv), **kw)


def run_in(name: str, argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    """subprocess.run of argv inside namespace `name`."""
    return subprocess.run(nsenter_argv(name, argv), check=check, **kw)


def _inode(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in(names: Sequence[str]) -> list[int]:
    """Processes (other than this one) whose network namespace is one of `names`."""
    inodes = {i for i in map(_inode, (ns_path(n) for n in names)) if i is not None}
    if not inodes:
        return []
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != me and _inode(entry / "ns/net") in inodes:
            pids.append(int(entry.name))
    return pids


def terminate_pids(pids: Sequence[int], grace: float = 2.0) -> None:
    """SIGTERM the given processes, SIGKILL whichever is still there after `grace` s."""
    def signal_all(sig: int) -> list[int]:
        alive = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                alive.append(pid)
        return alive

    pids = signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = [p for p in pids if _alive(p)]
    signal_all(signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (zombies hold no namespace)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
