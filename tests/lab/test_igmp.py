"""IGMP: afxdp workers on a bridge that snoops IGMP, has a querier on its
uplink and floods no group nobody joined (Lab(igmp=True),
switchml_xdp/lab/igmp.py), as strict switches do.

There, the switch's multicast RESULTs reach a worker only if the worker's kernel
joined the job's group: the afxdp backend must hold a membership on a kernel
socket although its frames arrive through AF_XDP. Without one, results still
trickle in as unicast shadow replies to retransmissions, so "results arrive"
is checked as "results arrive by multicast" (accepted results that are not
shadow replies), and the bridge's own table must list every worker's port.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from requires import NO_LAB

pytestmark = pytest.mark.skipif(NO_LAB is not None, reason=NO_LAB or "")

try:
    from switchml_xdp import _engine  # noqa: F401 - imported only to learn whether it is there
except ImportError as e:  # pragma: no cover - the build failed or was skipped
    pytest.skip(f"the AF_XDP engine is not built: {e}", allow_module_level=True)

WORLD = 2
N = 40_000                     # float32 elements: ~160 packets at k=256
MULTICAST_SHARE = 0.9          # of accepted results; 0 when nobody joined


def in_bridge_ns(lab, argv) -> str:
    """What argv prints, run in the lab's bridge namespace."""
    from switchml_xdp.lab import netns

    return netns.run_in(lab.bridge_ns, argv, capture_output=True, text=True).stdout


def bridge_groups(lab) -> dict[str, set[str]]:
    """{group address: bridge ports that joined it} from the lab bridge's MDB."""
    out = in_bridge_ns(lab, ["bridge", "-j", "mdb", "show", "dev", lab.bridge])
    groups: dict[str, set[str]] = {}
    for entry in json.loads(out or "[]"):
        for m in entry.get("mdb", []):
            groups.setdefault(m["grp"], set()).add(m["port"])
    return groups


def test_afxdp_results_arrive_by_multicast_through_an_igmp_snooping_bridge():
    from switchml_xdp import Worker, quant
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

    inputs = [np.random.default_rng([14, r]).standard_normal(N).astype(np.float32)
              for r in range(WORLD)]
    expected = quant.simulate_allreduce(inputs, 256)

    with Lab(workers=WORLD, igmp=True) as lab, SwitchProcess(lab):
        def body(rank, host):
            with Worker(lab.switch.ip, "igmp", rank, WORLD, backend="afxdp", verbose=False,
                        stall_timeout=20) as w:
                x = inputs[rank].copy()
                w.allreduce(x)
                groups = bridge_groups(lab)     # while the membership is held
                return x, w.stats(), w.info.group_ip, groups

        per_rank = run_ranks(lab, lab.workers, body, timeout=180)

    for rank, (x, stats, group, groups) in enumerate(per_rank):
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32)), f"rank {rank}"
        by_multicast = stats["results"] - stats["shadow_replies"]
        assert by_multicast >= MULTICAST_SHARE * stats["results"], (
            f"rank {rank}: only {by_multicast} of {stats['results']} results came by multicast "
            f"(the rest as shadow replies to retransmissions): {stats}")
        ports = groups.get(group, set())
        assert {h.peer for h in lab.workers} <= ports, (
            f"the bridge has not learnt every worker's membership of {group}: {groups}")


def test_the_igmp_bridge_snoops_and_its_uplink_queries():
    """The lab part alone: snooping on, no querier on the bridge itself (it
    would query a port that comes up), one with an address on its uplink."""
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.addressing import querier_links

    with Lab(workers=1, igmp=True) as lab:
        querier, uplink, _ = querier_links(lab.prefix)

        def bridge_info(bridge: str) -> dict:
            opts = in_bridge_ns(lab, ["ip", "-j", "-d", "link", "show", bridge])
            return json.loads(opts)[0]["linkinfo"]["info_data"]

        assert bridge_info(lab.bridge)["mcast_snooping"] == 1
        assert bridge_info(lab.bridge)["mcast_querier"] == 0
        assert bridge_info(querier)["mcast_querier"] == 1
        ports = json.loads(in_bridge_ns(lab, ["ip", "-j", "-d", "link", "show",
                                              "master", lab.bridge]))
        assert {p["ifname"] for p in ports} == {uplink} | {h.peer for h in lab.hosts}
        # The uplink never a router port: no copy of every group to the querier.
        assert {p["ifname"]: p["linkinfo"]["info_slave_data"]["multicast_router"]
                for p in ports}[uplink] == 0
        addrs = json.loads(in_bridge_ns(lab, ["ip", "-j", "addr", "show", querier]))
        assert [a["local"] for a in addrs[0]["addr_info"]] == ["10.0.0.254"]   # the queries' source
