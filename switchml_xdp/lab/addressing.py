"""The names and addresses of a lab, derived from its per-run prefix {p}:

    {p}-sw: {p}-s 10.0.0.1 ──veth── {p}-bs ┐
    {p}-w0: {p}-w0 10.0.0.11 ─veth─ {p}-b0 ├─ {p}-br0 (bridge, in ns {p}-br)
    {p}-w1: {p}-w1 10.0.0.12 ─veth─ {p}-b1 ┤
    {p}-q0 (bridge) 10.0.0.254 ─veth─ {p}-bq ┘ Lab(igmp=True): the IGMP querier, in ns {p}-br

Every name carries the prefix ("swl" + 5 hex digits unless given), so
concurrent labs never collide and everything a lab made can be found and
removed by prefix, also after the process that made it died. Pure functions:
nothing here touches the system.
"""
from __future__ import annotations

import dataclasses
import re
import secrets

from .errors import LabError

PREFIX_STEM = "swl"          # default prefixes start with it; `down --all` removes "swl*"
IFNAMSIZ = 15                # longest interface name Linux accepts
SUBNET_PREFIXLEN = 24
SWITCH_IP = "10.0.0.1"
WORKER_IP_BASE = 11          # worker i is 10.0.0.{11+i}
MAX_WORKERS = 254 - WORKER_IP_BASE + 1

_PREFIX_RE = re.compile(r"[A-Za-z0-9_]+")


@dataclasses.dataclass(frozen=True)
class Host:
    """One end host of the lab: the switch ("sw") or a worker ("w0", "w1", ...).

    `iface` is the host's veth end inside `ns`; `peer` is the other end, in the
    bridge namespace (where the loss injector and the pass program attach).
    """
    name: str
    ns: str
    iface: str
    ip: str
    mac: str
    peer: str


def new_prefix() -> str:
    """A fresh per-run prefix, e.g. "swl3fa2c"."""
    return PREFIX_STEM + secrets.token_hex(3)[:5]


def check_names(workers: int, prefix: str) -> None:
    """Reject a worker count or prefix that would fail half-way through the
    build, with a one-line reason."""
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise LabError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {workers!r}")
    if not _PREFIX_RE.fullmatch(prefix):
        raise LabError(f"prefix {prefix!r} may hold only letters, digits and '_'")
    longest = max(f"{prefix}-br0", f"{prefix}-w{workers - 1}", f"{prefix}-b{workers - 1}", key=len)
    if len(longest) > IFNAMSIZ:
        raise LabError(f"prefix {prefix!r} too long: interface {longest!r} would exceed "
                       f"{IFNAMSIZ} characters")


def _mac(side: int, group: int, index: int) -> str:
    """Locally administered, readable MACs: 02:5d:00:<side>:<group>:<index>.

    side 0 = host end, 1 = bridge end; group 0 = switch/bridge, 1 = workers.
    """
    return f"02:5d:00:{side:02x}:{group:02x}:{index:02x}"


def switch_host(prefix: str) -> Host:
    return Host("sw", f"{prefix}-sw", f"{prefix}-s", SWITCH_IP, _mac(0, 0, 1), f"{prefix}-bs")


def worker_host(prefix: str, i: int) -> Host:
    name = f"w{i}"
    return Host(name, f"{prefix}-{name}", f"{prefix}-{name}",
                f"10.0.0.{WORKER_IP_BASE + i}", _mac(0, 1, i), f"{prefix}-b{i}")


def bridge_mac() -> str:
    """The bridge's own MAC."""
    return _mac(1, 0, 0)


def peer_mac(host: Host) -> str:
    """The MAC of `host`'s bridge-side veth end (its port on the bridge)."""
    if host.name == "sw":
        return _mac(1, 0, 1)
    return _mac(1, 1, int(host.name[1:]))


def bridge_ns(prefix: str) -> str:
    return f"{prefix}-br"


def bridge_iface(prefix: str) -> str:
    return f"{prefix}-br0"


def querier_links(prefix: str) -> tuple[str, str, str]:
    """The snooping lab's querier (lab/igmp.py), in the bridge namespace: its
    bridge, the uplink's port on the lab bridge and its own port on the uplink."""
    return f"{prefix}-q0", f"{prefix}-bq", f"{prefix}-qb"


def is_namespace_of(prefix: str, ns: str) -> bool:
    """Whether `ns` is one of the namespaces lab `prefix` makes."""
    return re.fullmatch(rf"{re.escape(prefix)}-(br|sw|w\d+)", ns) is not None


def prefix_of(ns: str) -> str:
    """The prefix of a lab namespace's name."""
    return ns.rsplit("-", 1)[0]
