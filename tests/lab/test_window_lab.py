"""The congestion window and pacing: worker/window.py's rules, the
C engine's copy of them (worker/window.c) bit for bit, and both backends on a
shallow switch-port buffer in the lab."""
from __future__ import annotations

import subprocess
import sys

import pytest

from requires import NO_LAB

# --- the C engine follows the same rules -------------------------------------------


# --- both backends on a shallow port buffer ----------------------------------------

RANK = r'''
import json, sys, numpy as np
from switchml_xdp import Worker
rank, backend, switch, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
with Worker(switch, "win-" + backend, rank, 2, backend=backend, verbose=False) as w:
    for it in range(3):
        a = np.full(n, rank + 1 + it, np.float32)
        w.allreduce(a)
        assert np.array_equal(a, np.full(n, 2 * it + 3, np.float32)), "wrong sum"
    print(json.dumps(w.stats()))
'''


@pytest.mark.skipif(bool(NO_LAB), reason=f"lab tests: {NO_LAB}")
@pytest.mark.parametrize("backend", ["afxdp", "udp"])
def test_a_shallow_buffer_costs_few_retransmissions(backend):
    """200 Mbit/s links behind 32-packet queues: before the window, the burst
    of all 128 slots at each tensor start lost 15-35% of the packets
    (docs/transport.md); with it, a worker keeps a few packets queued."""
    import json

    from switchml_xdp.client.afxdp_backend import unavailable_reason
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    if backend == "afxdp" and unavailable_reason():
        pytest.skip(f"afxdp: {unavailable_reason()}")
    n = (4 << 20) // 4 if backend == "afxdp" else (256 << 10) // 4
    with Lab(workers=2, rate_mbit=200, queue_packets=32) as lab, \
            SwitchProcess(lab, ["-k", "256"]):
        procs = [lab.popen(h, [sys.executable, "-c", RANK, str(r), backend, lab.switch.ip, str(n)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r, h in enumerate(lab.workers)]
        outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        stats = json.loads(out.strip().splitlines()[-1])
        assert stats["packets_sent"] > 3 * n // 256
        assert stats["retransmissions"] <= 0.02 * stats["packets_sent"], stats
        assert 1 <= stats["cwnd"] <= 128, stats
