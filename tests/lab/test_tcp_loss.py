"""The bench's TCP dropper (switchml_xdp/bench/tcp_loss.py: Gloo's loss at
swml's rates, `swml-lab bench --loss`): through the door (bpf.tc_attach) on
every worker port's tc ingress and egress, at priority 1, before the lab's
loss injector's filters, which stay; it drops TCP and counts it both ways,
passes everything at 0, and leaves the injector in place when it goes."""
from __future__ import annotations

import pytest

from lab_jobs import tcp_stream
from requires import NO_LAB

pytestmark = pytest.mark.skipif(bool(NO_LAB), reason=f"lab tests: {NO_LAB}")

TCP_PORT = 47012
TCP_BYTES = 4 << 20


def stream(lab) -> list:
    return tcp_stream(lab, TCP_PORT, TCP_BYTES)


def test_the_tcp_dropper_sits_before_the_injector_drops_tcp_and_leaves_it_alone():
    from switchml_xdp import bpf
    from switchml_xdp.bench.tcp_loss import HOOKS, PRIO, TcpLoss
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.loss import TC_PRIO as INJECTOR_PRIO

    with Lab(workers=2) as lab:
        lab.set_loss(0)

        def on(egress: bool, prio: int):
            return [bpf.tc_attachment(w.peer, netns=lab.bridge_ns, egress=egress, prio=prio)
                    for w in lab.workers]

        injector = {egress: on(egress, INJECTOR_PRIO) for egress in (False, True)}
        assert all(f is not None for fs in injector.values() for f in fs), injector
        with TcpLoss(lab) as tl:
            for name, egress in HOOKS.items():
                assert [f.name for f in on(egress, PRIO)] == [name] * 2
            assert stream(lab) == [TCP_BYTES] * 2
            clean = tl.counters()
            assert clean["up"]["seen"] > 0 and clean["down"]["seen"] > 0, clean
            assert clean["up"]["dropped"] == clean["down"]["dropped"] == 0, clean
            tl.set(0.05)
            assert stream(lab) == [TCP_BYTES] * 2          # TCP repairs it
            lossy = tl.deltas(clean)
            assert lossy["tcp_dropped"] > 0.01 * lossy["tcp_frames"], lossy
        assert on(False, PRIO) == on(True, PRIO) == [None, None]
        assert {egress: on(egress, INJECTOR_PRIO) for egress in (False, True)} == injector
