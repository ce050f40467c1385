"""docs/transport.md, "The box's rate", in the lab: a box that stamps a rate
in its RESULTs' `pace` and a DSCP in their TOS gets from a worker, on either
backend, DATA at that rate (within 10%, as the rate changes) marked with
that DSCP, saying in `pace` the call's bytes left. The box is played by
hand (tests/support/pace_switch.py) in the switch's namespace, so the rate
is exactly the one stamped; the worker runs its backend alone, no daemon.
Then through the real box under --share, the ranks keep to what it stamps."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fake_switch import RESULT_KEY
from pace_switch import PacedSwitch, send_rates_bps, stamped
from switchml_xdp import wire

K, SLOTS, PHASE, PACKETS = 256, 64, 800, 1600
FRAME = wire.HEADERS_LEN + 4 * K                 # 1098 bytes: 8784 bits a DATA frame
RATES_KBPS = (4000, 8000)                        # packets < PHASE, then the others
DSCP = 10                                        # AF11
# The box here is Python on a shared machine: a round trip of a few ms under
# load is its lag, not a loss, and resends would only add to its work.
QUIET_TIMERS = {f"SWML_{b}_RTO_{t}": "0.05" for b in ("UDP", "AFXDP") for t in ("MIN", "INITIAL")}

WORKER = r'''
import json, sys
import numpy as np
from switchml_xdp.client.abort import AbortSignal
from switchml_xdp.client.backend import LocalEnd
from switchml_xdp.client.calls import Call
from switchml_xdp.client.control import JobInfo
backend, sw_ip, sw_mac, ip, iface, mac, k, slots, packets = sys.argv[1:]
k, slots, packets = int(k), int(slots), int(packets)
info = JobInfo(name="pace", job_id=3, world=1, rank=0, k=k, slots=slots, switch_ip=sw_ip,
               switch_mac=sw_mac, switch_port=48864, group_ip="239.77.0.3",
               group_mac="01:00:5e:4d:00:03", port=48900, heartbeat_s=1.0, key=0x1234,
               seq_base=0, result_key=bytes(range(16)), fanout="unicast")
if backend == "afxdp":
    from switchml_xdp.client.afxdp_backend import AfxdpBackend as Backend
else:
    from switchml_xdp.client.udp_backend import UdpBackend as Backend
be = Backend(info, LocalEnd(ip, iface, mac), AbortSignal(), verbose=False)
try:
    x = np.ones(k * packets, np.int32)
    be.allreduce(x, Call(0, "pace", x.size, "int32", "sum", "32"))
    assert (x == 1).all(), "wrong sum"
    print(json.dumps(be.stats()))
finally:
    be.close()
'''


def _stamp(h, values):
    rate = RATES_KBPS[int(h["seq"]) >= PHASE]
    return [(False, stamped(h, values, rate))]


@pytest.mark.parametrize("window", ["on", "off"])
def test_a_worker_sends_at_the_box_s_rate_with_its_dscp(fresh_lab, worker_backend, window):
    """With its window (SWML_WINDOW=on) or without (off: the cap alone paces)."""
    assert RESULT_KEY == bytes(range(16))       # the key WORKER's JobInfo holds
    sw_host, w = fresh_lab.switch, fresh_lab.workers[0]
    with fresh_lab.enter(sw_host):
        box = PacedSwitch(_stamp, dscp=DSCP, bind=(sw_host.ip, wire.DEFAULT_PORT))
    try:
        proc = fresh_lab.popen(w, [sys.executable, "-c", WORKER, worker_backend, sw_host.ip,
                              sw_host.mac, w.ip, w.iface, w.mac, str(K), str(SLOTS),
                              str(PACKETS)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **QUIET_TIMERS, "SWML_WINDOW": window})
        out, err = proc.communicate(timeout=120)
    finally:
        box.close()
    assert proc.returncode == 0, err[-2000:]
    stats = json.loads(out.strip().splitlines()[-1])
    phases = ([a for a in box.arrivals if int(a[1]["seq"]) < PHASE],
              [a for a in box.arrivals if int(a[1]["seq"]) >= PHASE])
    for rate_kbps, arrivals in zip(RATES_KBPS, phases):
        mean, paced = send_rates_bps(arrivals, FRAME, skip=100, bin_s=0.1)
        print(f"{worker_backend}, window {window}, {rate_kbps / 1e3:g} Mbit/s stamped: "
              f"{mean / 1e6:.2f} on average, {paced / 1e6:.2f} paced; {stats}")
        assert paced == pytest.approx(rate_kbps * 1e3, rel=0.1), stats
        assert 0.5 * rate_kbps * 1e3 < mean < 1.1 * rate_kbps * 1e3, stats
    assert stats["rate_kbps"] == RATES_KBPS[1] and stats["dscp"] == DSCP
    assert stats["rate_waits"] > PACKETS / 2
    tos = [t for _, _, t in box.arrivals]
    assert tos[0] == 0 and all(t == DSCP << 2 for t in tos[SLOTS:]), sorted(set(tos))
    first = {int(h["seq"]): int(h["pace"]) for _, h, _ in box.arrivals
             if not int(h["flags"]) & wire.FLAG_RETRANS}
    assert len(first) > 0.9 * PACKETS        # the others: lost where the box lagged
    assert first == {p: wire.pace_encode((PACKETS - p) * 4 * K) for p in first}


RANK = r'''
import json, sys, time
import numpy as np
from switchml_xdp import Worker
rank, backend, switch, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
with Worker(switch, "pace-" + backend, rank, 2, backend=backend, verbose=False) as w:
    w.allreduce(np.ones(n, np.float32))       # the first RESULTs bring the rate
    sent, t = w.stats()["packets_sent"], time.monotonic()
    for it in range(3):
        a = np.full(n, rank + 1 + it, np.float32)
        w.allreduce(a)
        assert np.array_equal(a, np.full(n, 2 * it + 3, np.float32)), "wrong sum"
    print(json.dumps({**w.stats(), "seconds": time.monotonic() - t,
                      "timed_packets": w.stats()["packets_sent"] - sent}))
'''


@pytest.mark.lab_workers(2)
def test_through_a_real_box_the_ranks_keep_to_its_share(fresh_lab, worker_backend):
    """swml-switch up --capacity 40M --share fair --dscp 10: the one job's
    ranks hear a rate and the mark, and send their frames at that rate
    (within 15% below, 10% above: their calls' ends wait on each other)."""
    from switchml_xdp.lab.cluster import SwitchProcess

    n = (2 << 20) // 4
    with SwitchProcess(fresh_lab, ["-k", "256", "--capacity", "40M", "--share", "fair",
                                   "--dscp", "10"]):
        procs = [fresh_lab.popen(h, [sys.executable, "-c", RANK, str(r), worker_backend,
                                     fresh_lab.switch.ip, str(n)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r, h in enumerate(fresh_lab.workers)]
        outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        s = json.loads(out.strip().splitlines()[-1])
        sent_bps = s["timed_packets"] * FRAME * 8 / s["seconds"]
        print(f"{worker_backend}: {s['rate_kbps']} kbit/s stamped, sent {sent_bps / 1e6:.2f} "
              f"Mbit/s of frames, dscp {s['dscp']}, {s['rate_waits']} rate waits")
        assert 0 < s["rate_kbps"] <= 40000 and s["dscp"] == DSCP and s["rate_waits"] > 0
        assert 0.85 < sent_bps / (s["rate_kbps"] * 1e3) < 1.1
