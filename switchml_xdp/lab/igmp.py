"""A lab bridge that behaves like a switch with IGMP snooping, as real networks run.

Used by the namespace lab (`Lab(igmp=True)`) and the VM lab (lab/vm.py).

A Linux bridge with multicast snooping learns, from the IGMP reports it sees,
which ports want which group. Once a querier exists, it forwards a group's
frames to those ports only (and to multicast-router ports, where queries come
from), also for groups nobody joined: a worker whose kernel never joined the
result group gets no results by multicast. Before that (the first query
response interval, or without a querier) it floods.

The VM lab's bridge is its own querier. The namespace lab's is not: its
querier is a router on an uplink (`add_uplink_querier`, a second bridge with
the querier on), as on most real networks, where the querier is a router or
one elected switch and the switch a worker plugs into sends no query when
that worker's port comes up. A Linux bridge that is itself the querier does
send one then, and so relearns at once a membership that the port's link
going down made it forget (a NIC that resets its link when an XDP program is
attached): the lab would hide what a real network does, which is to forget
the membership until the next general query (docs/testing.md). Its ports
flood unknown groups (a port that does not, `mcast_flood off`, gets no query
from an uplink either, its queries being link-local multicast the bridge
does not originate); the lab waits until the bridge has a querier
(`wait_for_querier`), after which it floods no group: tests/lab/test_igmp.py
sees a strict switch from the first packet.

The query interval is the lab's choice (`swml-lab up --snooping
--query-interval S`): 125 s as on real networks (RFC 3376's default, and the
Linux bridge's), so that a membership the bridge did not learn from the
worker's own reports stays unlearnt for minutes, as it would there; 5 s in
the tests that only need the bridge to learn and re-learn within their time.
The startup queries and the response interval stay short (1 s): the bridge
forwards by its table only one response interval after its querier starts.
The membership and other-querier intervals follow the query interval (RFC
3376 8.4 and 8.5), so neither lapses between two queries.
"""
from __future__ import annotations

import json
import time

from pyroute2 import IPRoute

from .. import net
from . import netns

CENTISECONDS = 100            # the bridge's timer attributes count clock_t ticks (1/100 s)
QUERY_INTERVAL_S = 5          # Lab(igmp=True)'s default: the tests' short one
REAL_QUERY_INTERVAL_S = 125   # real networks' (RFC 3376): `swml-lab up --snooping`'s default
MAX_QUERY_INTERVAL_S = 3600
STARTUP_QUERY_INTERVAL_S = 1
QUERY_RESPONSE_INTERVAL_S = 1
ROBUSTNESS = 2                # RFC 3376's default, and the Linux bridge's
# The querier's queries need a source address (a query from 0.0.0.0 is not
# elected querier on other bridges); the querier gets one outside the hosts' range.
QUERIER_HOST_OCTET = 254
# The uplink querier's first (startup) queries go out within a second of the
# build; a bridge that has learnt none in this long will not.
QUERIER_WAIT_S = 5.0
QUERIER_POLL_S = 0.1


def check_query_interval(seconds: float) -> float:
    """The querier's interval, within what a bridge takes (1 s to an hour)."""
    if not 1 <= seconds <= MAX_QUERY_INTERVAL_S:
        raise ValueError(f"query interval {seconds:g} s: must be 1 to {MAX_QUERY_INTERVAL_S} s")
    return seconds


def snooping_bridge_attrs(query_interval_s: float = QUERY_INTERVAL_S) -> dict:
    """pyroute2 `link("add", kind="bridge", **attrs)` attributes: snooping on
    (IGMPv3), a query every query_interval_s, short startup and response
    timers, memberships and another querier held for ROBUSTNESS query
    intervals, the queries from the bridge's address; start_querier() then
    adds the querier, if this bridge is to be one."""
    query = round(query_interval_s * CENTISECONDS)
    response = QUERY_RESPONSE_INTERVAL_S * CENTISECONDS
    return {
        "br_mcast_snooping": 1,
        "br_mcast_igmp_version": 3,
        # Without it the queries come from 0.0.0.0, whatever address the bridge has.
        "br_mcast_query_use_ifaddr": 1,
        "br_mcast_query_intvl": query,
        "br_mcast_startup_query_intvl": STARTUP_QUERY_INTERVAL_S * CENTISECONDS,
        "br_mcast_query_response_intvl": response,
        "br_mcast_membership_intvl": ROBUSTNESS * query + response,
        "br_mcast_querier_intvl": ROBUSTNESS * query + response // 2,
    }


def start_querier(ipr: IPRoute, bridge_index: int, host_ip: str, prefixlen: int) -> None:
    """Give the bridge an address in the hosts' subnet (the queries' source),
    then turn its querier on. Not at creation: the bridge forwards by its
    table only once a querier has existed for one query response interval,
    and it takes the interval in force when the querier is switched on (at
    creation, the default 10 s rather than ours)."""
    ipr.addr("add", index=bridge_index, address=querier_address(host_ip), prefixlen=prefixlen)
    ipr.link("set", index=bridge_index, kind="bridge", br_mcast_querier=1)


def add_uplink_querier(ipr: IPRoute, ns: str, bridge: str, names: tuple[str, str, str],
                       host_ip: str, prefixlen: int, query_interval_s: float) -> None:
    """A querier on an uplink of `bridge` (a snooping bridge that is no querier
    itself), both in namespace `ns`: names = (the querier's bridge, the
    uplink's port on `bridge`, the querier's port on it), the queries every
    query_interval_s from the querier's address in host_ip's subnet."""
    querier, uplink, querier_port = names
    ipr.link("add", ifname=querier, kind="bridge", **snooping_bridge_attrs(query_interval_s))
    ipr.link("add", ifname=uplink, kind="veth", peer=querier_port)
    ipr.link("set", index=net.link_index(uplink, ns), master=net.link_index(bridge, ns), state="up")
    ipr.link("set", index=net.link_index(querier_port, ns), master=net.link_index(querier, ns),
             state="up")
    ipr.link("set", index=net.link_index(querier, ns), state="up")
    start_querier(ipr, net.link_index(querier, ns), host_ip, prefixlen)


def wait_for_querier(ns: str, bridge: str, uplink: str, wait_s: float = QUERIER_WAIT_S) -> None:
    """Return once `bridge` forwards by its table: it has heard a query on
    `uplink` (which made it a multicast-router port) and one response interval
    has passed. RuntimeError if no query came within wait_s.

    The uplink is then made a port that is never a router's: a router port
    gets a copy of every group, which a real switch makes in hardware and
    the lab would pay for in CPU on every RESULT, skewing what tests time.
    The bridge keeps the querier (its other-querier timer runs on all the
    same) and floods its queries to every port."""
    deadline = time.monotonic() + wait_s
    while uplink not in router_ports(ns, bridge):
        if time.monotonic() > deadline:
            raise RuntimeError(f"bridge {bridge} heard no IGMP query on {uplink} in {wait_s:g} s")
        time.sleep(QUERIER_POLL_S)
    netns.run_in(ns, ["bridge", "link", "set", "dev", uplink, "mcast_router", "0"])
    time.sleep(QUERY_RESPONSE_INTERVAL_S)


def router_ports(ns: str, bridge: str) -> set[str]:
    """The ports of `bridge` it holds for multicast routers (where queries came
    from; `bridge mdb` lists them only with -d)."""
    out = netns.run_in(ns, ["bridge", "-d", "-j", "mdb", "show", "dev", bridge],
                       capture_output=True, text=True).stdout
    return {p["port"] for entry in json.loads(out or "[]")
            for ports in entry.get("router", {}).values() for p in ports}


def querier_address(host_ip: str) -> str:
    """The querier's own address in the hosts' /24."""
    return host_ip.rsplit(".", 1)[0] + f".{QUERIER_HOST_OCTET}"
