"""A lab bridge that behaves like a switch with IGMP snooping, as real networks run.

Used by the namespace lab (`Lab(igmp=True)`) and the VM lab (lab/vm.py).

A Linux bridge with multicast snooping learns, from the IGMP reports it sees,
which ports want which group. Once a querier exists (the bridge runs one
itself, as real switches or routers do and libvirt networks do not), it
forwards a group's frames to those ports only (and to multicast-router
ports), also for groups nobody joined: a worker whose kernel never joined the
result group gets no results by multicast. Before that (the first query
response interval, or without a querier) it floods; stopping ports flooding
unknown groups (`stop_flooding_unknown_groups`, as strict switches do) closes
that gap too, so tests/lab/test_igmp.py sees the same from the first packet.

The query interval is the lab's choice (`swml-lab up --snooping
--query-interval S`): 125 s as on real networks (RFC 3376's default, and the
Linux bridge's), so that a membership the bridge did not learn from the
worker's own reports stays unlearnt for minutes, as it would there; 5 s in
the tests that only need the bridge to learn and re-learn within their time.
The startup queries and the response interval stay short (1 s): the bridge
forwards by its table only one response interval after its querier starts.
"""
from __future__ import annotations

from pyroute2 import IPRoute

CENTISECONDS = 100            # the bridge's timer attributes count clock_t ticks (1/100 s)
QUERY_INTERVAL_S = 5          # Lab(igmp=True)'s default: the tests' short one
REAL_QUERY_INTERVAL_S = 125   # real networks' (RFC 3376): `swml-lab up --snooping`'s default
MAX_QUERY_INTERVAL_S = 3600
STARTUP_QUERY_INTERVAL_S = 1
QUERY_RESPONSE_INTERVAL_S = 1
# The querier's queries need a source address (a query from 0.0.0.0 is not
# elected querier on other bridges); the bridge gets one outside the hosts' range.
QUERIER_HOST_OCTET = 254


def check_query_interval(seconds: float) -> float:
    """The querier's interval, within what a bridge takes (1 s to an hour)."""
    if not 1 <= seconds <= MAX_QUERY_INTERVAL_S:
        raise ValueError(f"query interval {seconds:g} s: must be 1 to {MAX_QUERY_INTERVAL_S} s")
    return seconds


def snooping_bridge_attrs(query_interval_s: float = QUERY_INTERVAL_S) -> dict:
    """pyroute2 `link("add", kind="bridge", **attrs)` attributes: snooping on
    (IGMPv3), a query every query_interval_s, short startup and response
    timers, the queries from the bridge's address; start_querier() then adds
    the querier."""
    return {
        "br_mcast_snooping": 1,
        "br_mcast_igmp_version": 3,
        # Without it the queries come from 0.0.0.0, whatever address the bridge has.
        "br_mcast_query_use_ifaddr": 1,
        "br_mcast_query_intvl": round(query_interval_s * CENTISECONDS),
        "br_mcast_startup_query_intvl": STARTUP_QUERY_INTERVAL_S * CENTISECONDS,
        "br_mcast_query_response_intvl": QUERY_RESPONSE_INTERVAL_S * CENTISECONDS,
    }


def start_querier(ipr: IPRoute, bridge_index: int, host_ip: str, prefixlen: int) -> None:
    """Give the bridge an address in the hosts' subnet (the queries' source),
    then turn its querier on. Not at creation: the bridge forwards by its
    table only once a querier has existed for one query response interval,
    and it takes the interval in force when the querier is switched on (at
    creation, the default 10 s rather than ours)."""
    ipr.addr("add", index=bridge_index, address=querier_address(host_ip), prefixlen=prefixlen)
    ipr.link("set", index=bridge_index, kind="bridge", br_mcast_querier=1)


def querier_address(host_ip: str) -> str:
    """The bridge's own address in the hosts' /24."""
    return host_ip.rsplit(".", 1)[0] + f".{QUERIER_HOST_OCTET}"


def stop_flooding_unknown_groups(ipr: IPRoute, port_index: int) -> None:
    """Strict snooping on one bridge port: only groups a host behind it joined."""
    ipr.brport("set", index=port_index, mcast_flood=0)
