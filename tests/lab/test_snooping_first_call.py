"""The first call on a network that snoops IGMP is as fast as on one that floods.

A snooping switch sends the job's group only to ports whose host reported
itself a member, and learns of members only from the reports a host sends when
it joins or when the querier asks (every 125 s on real networks). Many NICs
reset their queues or their link when an XDP program or an AF_XDP socket is
attached: a report sent before that is lost, and a switch also forgets a port's
memberships when its link goes down. The afxdp worker therefore joins last,
once its datapath is attached and its link is up (switchml_xdp/client/port.py).

Here every worker's link goes down as its XDP program is attached and comes
back 1.5 s later (veth does not reset by itself, so the test does it), on a
bridge with a querier asking every 125 s (`swml-lab up --snooping`) and on a
bridge that floods; the first call of each job must take about as long on the
first as on the second. The Linux bridge also queries a port that comes up,
which many switches do not, so the order itself (the join after the datapath,
on a link that is up) is checked on its own.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from requires import NO_LAB

pytestmark = pytest.mark.skipif(NO_LAB is not None, reason=NO_LAB or "")

try:
    from switchml_xdp import _engine  # noqa: F401 - imported only to learn whether it is there
except ImportError as e:  # pragma: no cover - the build failed or was skipped
    pytest.skip(f"the AF_XDP engine is not built: {e}", allow_module_level=True)

WORLD = 3
N = 1 << 20                    # float32 elements: 4 MiB, ~4,200 packets at k=256
JOBS = 2
LINK_DOWN_S = 1.5              # a NIC's renegotiation after an XDP attach
QUERY_INTERVAL_S = 125         # a real network's
RATIO = 1.2                    # the target: the first call within 1.2x a flooding bridge's
SLACK_S = 0.25                 # a 4 MiB call takes ~0.1 s here: scheduling noise on a busy box
SETTLE_S = 1.0                 # after the link is back, before the call, on both bridges


def resetting_links(monkeypatch, lab) -> dict[str, threading.Event]:
    """Every afxdp worker's link goes down as it attaches its XDP program and
    comes back LINK_DOWN_S later, as on a NIC that resets then (the bridge side
    of the veth taken down: the bridge forgets the port's memberships, the
    worker's side loses its carrier). Returns {worker's interface: set once
    its link is back}."""
    from switchml_xdp.client import afxdp_backend
    from switchml_xdp.lab import netns

    attach = afxdp_backend.AfxdpBackend._attach
    back = {h.iface: threading.Event() for h in lab.workers}

    def attach_with_reset(self, *args, **kwargs):
        host = next(h for h in lab.workers if h.iface == self.iface)

        def bridge_port(state: str) -> None:
            netns.run_in(lab.bridge_ns, ["ip", "link", "set", host.peer, state], check=True)
            if state == "up":
                back[host.iface].set()

        back[host.iface].clear()
        bridge_port("down")
        try:
            return attach(self, *args, **kwargs)
        finally:
            threading.Timer(LINK_DOWN_S, bridge_port, ("up",)).start()

    monkeypatch.setattr(afxdp_backend.AfxdpBackend, "_attach", attach_with_reset)
    return back


def first_calls(monkeypatch, snooping: bool) -> list[tuple[float, list[int]]]:
    """(the slowest rank's first call in seconds, every rank's shadow replies
    in it) for JOBS jobs of WORLD afxdp workers, all ranks starting the call
    together."""
    from switchml_xdp import Worker
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

    out = []
    with Lab(workers=WORLD, igmp=snooping,
             query_interval_s=QUERY_INTERVAL_S if snooping else None) as lab, SwitchProcess(lab):
        link_back = resetting_links(monkeypatch, lab)
        for job in range(JOBS):
            together = threading.Barrier(WORLD)

            def body(rank, host, job=job, together=together):
                x = np.ones(N, np.float32)
                with Worker(lab.switch.ip, f"first{job}", rank, WORLD, backend="afxdp",
                            verbose=False, stall_timeout=60) as w:
                    # The same start on both bridges: the link back and settled.
                    assert link_back[host.iface].wait(30), f"{host.iface}: link not back"
                    time.sleep(SETTLE_S)
                    together.wait()
                    start = time.monotonic()
                    w.allreduce(x)
                    took = time.monotonic() - start
                    assert np.all(x == WORLD), f"rank {rank}: wrong sum"
                    return took, w.stats()["shadow_replies"]

            ranks = run_ranks(lab, lab.workers, body, timeout=300)
            out.append((max(t for t, _ in ranks), [s for _, s in ranks]))
        monkeypatch.undo()
    return out


def test_the_first_call_on_a_snooping_bridge_is_as_fast_as_on_a_flooding_one(monkeypatch):
    flooding = first_calls(monkeypatch, snooping=False)
    snooping = first_calls(monkeypatch, snooping=True)
    flood_s = max(t for t, _ in flooding)
    snoop_s = max(t for t, _ in snooping)
    assert snoop_s <= RATIO * flood_s + SLACK_S, (
        f"first call {snoop_s:.3f} s on a snooping bridge (125 s queries) against "
        f"{flood_s:.3f} s on a flooding one: the workers' membership was not learnt at once "
        f"(shadow replies per job and rank: {[s for _, s in snooping]})")


def test_the_afxdp_worker_joins_its_group_after_its_datapath_is_up(monkeypatch):
    """The join (and with it the kernel's reports) comes after the XDP program
    is attached and the AF_XDP socket is open, on a link with its carrier."""
    from switchml_xdp import Worker, bpf, net
    from switchml_xdp.client import afxdp_backend
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

    seen = []
    join = afxdp_backend.join_when_up

    def recording_join(sock, group_ip, local_ip, iface, *args, **kwargs):
        up = join(sock, group_ip, local_ip, iface, *args, **kwargs)
        seen.append((bpf.attachment(iface).mode, net.link_has_carrier(iface), up))
        return up

    monkeypatch.setattr(afxdp_backend, "join_when_up", recording_join)
    with Lab(workers=1, igmp=True, query_interval_s=QUERY_INTERVAL_S) as lab, SwitchProcess(lab):
        def body(rank, host):
            with Worker(lab.switch.ip, "order", rank, 1, backend="afxdp", verbose=False) as w:
                x = np.ones(1000, np.float32)
                w.allreduce(x)
                return bool(np.all(x == 1))

        assert run_ranks(lab, lab.workers, body, timeout=120) == [True]
    assert len(seen) == 1 and seen[0][0] is not None and seen[0][1:] == (True, True), seen
