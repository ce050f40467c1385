"""The names and addresses of a lab, derived from its per-run prefix {p}:

    {p}-sw: {p}-s 10.0.0.1 ──veth── {p}-bs ┐
    {p}-sw1: {p}-s1 10.0.0.2 ─veth─ {p}-bs1 ┤ Lab(boxes=M): box b (1..M-1) is "sw{b}"
    {p}-w0: {p}-w0 10.0.0.11 ─veth─ {p}-b0 ├─ {p}-br0 (bridge, in ns {p}-br)
    {p}-w1: {p}-w1 10.0.0.12 ─veth─ {p}-b1 ┤
    {p}-q0 (bridge) 10.0.0.254 ─veth─ {p}-bq ┘ Lab(igmp=True): the IGMP querier, in ns {p}-br

The boxes (switch hosts) take 10.0.0.1 up to 10.0.0.{MAX_BOXES}, below the
workers' first address (WORKER_IP_BASE), so no worker count can reach them;
box 0 is the lab's switch (`Lab.switch`, "sw", 10.0.0.1) however many there are.
A lab of racks (lab/racks.py) adds rack r's box in {p}-r{r}: its port "r{r}"
on the rack's own subnet 10.0.{1+r}.0/24 and its uplink "u{r}" 10.0.0.{2+r}
on the core's.

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
SWITCH_IP = "10.0.0.1"       # box 0's; box b is 10.0.0.{1+b}
MAX_BOXES = 8                # 10.0.0.1 .. 10.0.0.8: below the workers' base
WORKER_IP_BASE = 11          # worker i is 10.0.0.{11+i}
MAX_WORKERS = 254 - WORKER_IP_BASE + 1

_PREFIX_RE = re.compile(r"[A-Za-z0-9_]+")


@dataclasses.dataclass(frozen=True)
class Host:
    """One end host of the lab: a box ("sw", then "sw1", "sw2", ...) or a
    worker ("w0", "w1", ...).

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


def check_names(workers: int, prefix: str, boxes: int = 1) -> None:
    """Reject a worker or box count or a prefix that would fail half-way
    through the build, with a one-line reason."""
    if not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise LabError(f"workers must be an integer from 1 to {MAX_WORKERS}, not {workers!r}")
    if isinstance(boxes, bool) or not isinstance(boxes, int) or not 1 <= boxes <= MAX_BOXES:
        raise LabError(f"boxes must be an integer from 1 to {MAX_BOXES}, not {boxes!r}")
    if not _PREFIX_RE.fullmatch(prefix):
        raise LabError(f"prefix {prefix!r} may hold only letters, digits and '_'")
    last_box = box_host(prefix, boxes - 1)
    longest = max(f"{prefix}-br0", f"{prefix}-w{workers - 1}", f"{prefix}-b{workers - 1}",
                  last_box.iface, last_box.peer, key=len)
    if len(longest) > IFNAMSIZ:
        raise LabError(f"prefix {prefix!r} too long: interface {longest!r} would exceed "
                       f"{IFNAMSIZ} characters")


def _mac(side: int, group: int, index: int) -> str:
    """Locally administered, readable MACs: 02:5d:00:<side>:<group>:<index>.

    side 0 = host end, 1 = bridge end; group 0 = switch/bridge, 1 = workers.
    """
    return f"02:5d:00:{side:02x}:{group:02x}:{index:02x}"


def switch_host(prefix: str) -> Host:
    """Box 0, the lab's switch."""
    return box_host(prefix, 0)


def box_host(prefix: str, b: int) -> Host:
    """Box `b` (0 .. MAX_BOXES-1): "sw" for 0, "sw{b}" after it; its MACs
    are the switch group's, index 1+b."""
    tail = str(b) if b else ""
    return Host(f"sw{tail}", f"{prefix}-sw{tail}", f"{prefix}-s{tail}", f"10.0.0.{1 + b}",
                _mac(0, 0, 1 + b), f"{prefix}-bs{tail}")


def port_host(prefix: str, j: int) -> Host:
    """Port `j` (1 .. MAX_PORTS-1) of the lab's switch, Lab(ports=P): a veth
    in the switch's namespace, to segment j's bridge; it has no address of
    its own (the box's bridge holds the switch's, lab/box_ports.py). Its
    MACs are group 2's."""
    return Host(f"swp{j}", f"{prefix}-sw", f"{prefix}-sp{j}", SWITCH_IP, _mac(0, 2, j),
                f"{prefix}-bsp{j}")


def segment_bridge(prefix: str, j: int) -> str:
    """The bridge of segment j (in the bridge namespace): the lab's bridge for 0."""
    return f"{prefix}-br{j}"


def box_index(host: Host) -> int | None:
    """Which box `host` is, or None for a worker."""
    m = re.fullmatch(r"sw(\d*)", host.name)
    return None if m is None else int(m.group(1) or 0)


def worker_host(prefix: str, i: int) -> Host:
    name = f"w{i}"
    return Host(name, f"{prefix}-{name}", f"{prefix}-{name}",
                f"10.0.0.{WORKER_IP_BASE + i}", _mac(0, 1, i), f"{prefix}-b{i}")


def rack_port_host(prefix: str, r: int) -> Host:
    """Rack r's box, its port on the rack's segment (RacksLab, lab/racks.py):
    namespace {p}-r{r}, the first address of the rack's subnet 10.0.{1+r}.0/24.
    MACs of group 3."""
    return Host(f"r{r}", f"{prefix}-r{r}", f"{prefix}-r{r}", f"10.0.{1 + r}.1", _mac(0, 3, r),
                f"{prefix}-bp{r}")


def uplink_host(prefix: str, r: int) -> Host:
    """Rack r's uplink to the core segment, in the rack box's namespace: the
    core's 10.0.0.{2+r}, below the workers' base as the boxes' are. MACs of
    group 4."""
    return Host(f"u{r}", f"{prefix}-r{r}", f"{prefix}-u{r}", f"10.0.0.{2 + r}", _mac(0, 4, r),
                f"{prefix}-bu{r}")


def rack_worker_host(prefix: str, i: int, r: int, j: int) -> Host:
    """Worker i, the j-th of rack r, on the rack's own subnet (a tree of
    racks, lab/racks.py); worker_host(prefix, i) is the same worker on the
    core's subnet."""
    flat = worker_host(prefix, i)
    return dataclasses.replace(flat, ip=f"10.0.{1 + r}.{WORKER_IP_BASE + j}")


def rack_bridge(prefix: str, r: int) -> str:
    """Rack r's segment (a bridge in the bridge namespace)."""
    return f"{prefix}-rk{r}"


def bridge_mac() -> str:
    """The bridge's own MAC."""
    return _mac(1, 0, 0)


def peer_mac(host: Host) -> str:
    """The MAC of `host`'s bridge-side veth end (its port on the bridge)."""
    b = box_index(host)
    if b is not None:
        return _mac(1, 0, 1 + b)
    if host.name.startswith("swp"):
        return _mac(1, 2, int(host.name[3:]))
    if host.name[0] in "ru":   # a rack box's port or uplink
        return _mac(1, 3 if host.name[0] == "r" else 4, int(host.name[1:]))
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
    return re.fullmatch(rf"{re.escape(prefix)}-(br|sw|sw[1-9]|w\d+|r\d)", ns) is not None


def prefix_of(ns: str) -> str:
    """The prefix of a lab namespace's name."""
    return ns.rsplit("-", 1)[0]
