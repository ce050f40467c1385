"""Reliability, loss: loss in both directions on every worker
link, for both backends; results exact, retransmissions consistent with the
drops the lab's loss injector counted (see reliability_helpers.py for the
counter identities)."""
from __future__ import annotations

import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from reliability_helpers import (
    PORT,
    K,
    bits,
    cdelta,
    float_tensor,
    int_tensor,
    job_name,
    link_drops,
    loss_delta,
    outcome_sum,
    packets,
    report,
    settle,
    switch_counters,
    upstream_drops,
    wrap_sum,
)
from switchml_xdp import quant, wire
from switchml_xdp.client.retransmit import ENGINE_POLICY, PYTHON_POLICY
from switchml_xdp.lab.cluster import run_ranks

# (rate, mean burst length or None for independent drops): up to 10% random
# and 5% in Gilbert-Elliott bursts of 4 frames (docs/transport.md, "Loss by
# evidence")
LOSS_LEVELS = [(0.0, None), (0.001, None), (0.01, None), (0.02, None), (0.05, None),
               (0.10, None), (0.05, 4)]
N_INT, N_FLOAT = 250 * K - 17, 250 * K + 3          # 250 + 251 packets each way, a worker


def _afxdp_reason() -> str | None:
    try:
        from switchml_xdp.client import afxdp_backend
    except ImportError as e:
        return f"the AF_XDP engine is not built ({e})"
    return afxdp_backend.unavailable_reason()


@pytest.fixture(scope="class", params=["udp", "udp-python", "afxdp"])
def loss_job(request, lab8, switch):
    """A 4-worker job kept for the whole loss matrix of one backend (an afxdp
    worker compiles its redirect program at set-up: ~1.5 s each). afxdp takes
    w0-w3 (one afxdp worker per interface), udp w4-w7: on the C engine where it
    is built ("udp") and on its Python loop ("udp-python", SWML_UDP_ENGINE=0)."""
    from switchml_xdp import Worker
    from switchml_xdp.client.engine_backend import engine_missing

    backend = request.param
    if backend == "afxdp" and (reason := _afxdp_reason()):
        pytest.skip(reason)
    if backend == "udp" and (reason := engine_missing()):
        pytest.skip(f"the udp backend's engine: {reason}")
    hosts = lab8.workers[:4] if backend == "afxdp" else lab8.workers[4:8]
    name = job_name(f"loss-{backend}")

    def join(rank, host):
        return Worker(lab8.switch.ip, name, rank, len(hosts), backend=backend.split("-")[0],
                      verbose=False, stall_timeout=30)

    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:    # read as each backend is made
        mp.setenv("SWML_UDP_ENGINE", "0" if backend == "udp-python" else "1")
        workers = run_ranks(lab8, hosts, join, timeout=120)
    report("loss job set-up", backend=backend, seconds=f"{time.monotonic() - t0:.2f}")
    if backend.startswith("udp"):   # the loop asked for is the one that runs
        assert {w.stats()["loop"] for w in workers} == {"python" if "python" in backend else "engine"}
    try:
        yield backend, hosts, workers
    finally:
        lab8.set_loss(0, hosts=lab8.workers, port=PORT)
        run_ranks(lab8, hosts, lambda rank, host: workers[rank].close(), timeout=60)


class TestLossMatrix:
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("loss,burst", LOSS_LEVELS,
                             ids=lambda v: f"{v:.1%}" if isinstance(v, float) else f"bursts{v}")
    def test_exact_under_loss_with_consistent_retransmissions(self, lab8, switch, loss_job, loss,
                                                              burst):
        """4 workers, `loss` on every worker link in both directions.

        Per worker w and per packet, a dropped upstream DATA must be sent
        again; a dropped RESULT (multicast or shadow) too: the first copy of
        w's contribution that arrives never gets a shadow reply, and neither
        does the one whose shadow reply finally arrives, so each of the other
        sends carries at most one drop. Hence
            retransmissions_w >= up_dropped_w + down_dropped_w.
        At the switch every packet index completes once and every worker
        contributes once per index, so everything else that arrived is a
        retransmission answered by a shadow reply or dropped as a duplicate:
            shadow_reply + dup_dropped == rx - world * packets
                                       == sum_w (retransmissions_w - up_dropped_w)
        (the second form when no veth on the way dropped a frame; measured).
        Hence also shadow_reply <= sum_w retransmissions_w.
        """
        backend, hosts, workers = loss_job
        world = len(hosts)
        seed = int(loss * 10000) + (burst or 0)
        ints = [int_tensor([seed, 1, r], N_INT) for r in range(world)]
        floats = [float_tensor([seed, 2, r], N_FLOAT, r) for r in range(world)]
        npk = packets(N_INT) + packets(N_FLOAT, np.float32, workers[0].info.slots)

        def body(rank, host):
            w = workers[rank]
            a, b = ints[rank].copy(), floats[rank].copy()
            w.allreduce(a)
            w.allreduce(b)
            return a, b

        lab8.set_loss(loss, hosts=hosts, direction="both", port=PORT, burst=burst)
        try:
            c0, l0, s0 = switch_counters(switch), lab8.loss_counters(), [w.stats() for w in workers]
            drops0 = link_drops(lab8)
            t0 = time.monotonic()
            results = run_ranks(lab8, hosts, body, timeout=50)
            elapsed = time.monotonic() - t0
            s1 = [w.stats() for w in workers]
            sent = {h.name: s1[r]["packets_sent"] - s0[r]["packets_sent"] for r, h in enumerate(hosts)}

            def arrived():
                d = loss_delta(l0, lab8.loss_counters())
                return (all(d[h]["up"]["seen"] == sent[h] for h in sent) and
                        cdelta(c0, switch_counters(switch))["rx"] ==
                        sum(d[h]["up"]["passed"] for h in sent))

            settle(arrived)
            c, ld = cdelta(c0, switch_counters(switch)), loss_delta(l0, lab8.loss_counters())
            drops = upstream_drops(lab8, drops0, link_drops(lab8), hosts)
        finally:
            lab8.set_loss(0, hosts=hosts, port=PORT)

        ref_i, ref_f = wrap_sum(ints), quant.simulate_allreduce(floats, K)
        for rank, (a, b) in enumerate(results):
            np.testing.assert_array_equal(a, ref_i, err_msg=f"int32, rank {rank}")
            assert np.array_equal(bits(b), bits(ref_f)), f"float32 not bit-identical, rank {rank}"

        retx = {h.name: s1[r]["retransmissions"] - s0[r]["retransmissions"]
                for r, h in enumerate(hosts)}
        bs = lab8.switch.peer
        for r, h in enumerate(hosts):
            up, down = ld[h.name]["up"], ld[h.name]["down"]
            assert up["seen"] == up["dropped"] + up["passed"] and up["duplicated"] == 0, up
            assert down["seen"] == down["dropped"] + down["passed"], down
            assert sent[h.name] == npk + retx[h.name], (h.name, sent, retx)
            assert s1[r]["results"] - s0[r]["results"] == npk
            # Every frame the worker sent crossed its link's loss hook, but for
            # any its own veth dropped (a full ring under load; measured).
            assert 0 <= sent[h.name] - up["seen"] <= drops.get(h.iface, 0), (h.name, up, drops)
            assert retx[h.name] >= up["dropped"] + down["dropped"], (h.name, retx, up, down)
        up_dropped = sum(ld[h.name]["up"]["dropped"] for h in hosts)
        down_dropped = sum(ld[h.name]["down"]["dropped"] for h in hosts)
        up_passed = sum(ld[h.name]["up"]["passed"] for h in hosts)
        assert c["rx"] == outcome_sum(c), c
        assert not any(c[r] for r in wire.DROP_REASONS), c
        assert c["completed"] == npk and c["aggregated"] == (world - 1) * npk, c
        assert c["shadow_reply"] + c["dup_dropped"] == c["rx"] - world * npk, c
        # What the workers' links passed reached the switch, but for what the
        # bridge's port to the switch dropped (measured; 0 unless the machine
        # is so loaded that softirq work waits for ksoftirqd).
        assert 0 <= up_passed - c["rx"] <= drops.get(bs, 0), (up_passed, c, drops)
        if not drops:
            assert c["rx"] == up_passed
            assert c["shadow_reply"] + c["dup_dropped"] == sum(retx.values()) - up_dropped, (c, retx)
        assert c["shadow_reply"] <= sum(retx.values())
        if loss >= 0.01:   # 1000+ frames each way: some loss is certain (P(none) < 1e-4)
            assert up_dropped > 0 and down_dropped > 0, ld
        if loss == 0:
            assert up_dropped == down_dropped == 0
        # Found by evidence, not by timers: a later packet's RESULT reveals a
        # loss within a round trip, the tail probe's answer one at the tail
        # (the timers remain for what neither reveals, and a late rank).
        evidence = sum(s1[r][key] - s0[r][key] for r in range(world)
                       for key in ("rack_resends", "tail_probes"))
        # The udp backend's Python loop, descheduled on a loaded machine, lets
        # more timers run out first: 60-80% of its resends on evidence in
        # bursts of 4 here, under half once under CI's load; the engine's
        # 87-96% (afxdp; udp on the engine alike).
        if loss >= 0.01:
            share = 0.25 if backend == "udp-python" else 0.5
            assert evidence >= share * sum(retx.values()), (evidence, retx)
        # ... and the timeout stays far from its cap (the engine's ran up to
        # its 0.5 s cap at 5% loss when timers found every loss; a few
        # doublings of the udp backend's 5 ms floor in bursts are fine)
        cap = (PYTHON_POLICY if backend == "udp-python" else ENGINE_POLICY).max_s
        assert all(st["rto_us"] < cap * 1e6 / 4 for st in s1), [st["rto_us"] for st in s1]
        report("loss", backend=backend, loss=f"{loss:.1%}", burst=burst, packets_per_worker=npk,
               seconds=f"{elapsed:.2f}", up_dropped=up_dropped, down_dropped=down_dropped,
               retransmissions=sum(retx.values()), on_evidence=evidence,
               shadow_replies=c["shadow_reply"],
               dup_dropped=c["dup_dropped"], veth_drops=drops)
