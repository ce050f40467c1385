"""The udp backend on the C engine (switchml_xdp/client/udp_engine_backend.py,
worker/udp_port.c) against the real XDP switch: a rank without root streams on
it, in one job with a rank on the udp backend's Python loop, exactly; its
datagrams go out in batches (fewer sendmmsg kicks than packets); and a job
of two such ranks is as exact through loss as the afxdp engine."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from lab_jobs import K, run_job
from reliability_helpers import job_name
from requires import needs_lab
from switchml_xdp.client.engine_backend import engine_missing

pytestmark = [needs_lab, pytest.mark.skipif(bool(engine_missing()),
                                            reason=f"the engine is not built: {engine_missing()}")]

N = 40 * K + 5  # 41 packets of int32, the last one short

# One rank as a process of its own: prints what it reduced and its counters.
RANK = """
import json, sys
import numpy as np
from switchml_xdp import Worker
switch, job, rank, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Worker(switch, job, rank, 2, backend="udp", verbose=False, stall_timeout=30) as w:
    x = np.arange(n, dtype=np.int32) * (rank + 1)
    w.allreduce(x)
    print(json.dumps({"sum": x.tolist(), "loop": w.stats()["loop"], "stats": w.stats()}))
"""

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _rank(lab, host, job: str, rank: int, as_nobody: bool, python_loop: bool):
    env = {"SWML_UDP_ENGINE": "0" if python_loop else "1", "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-c", RANK, lab.switch.ip, job, str(rank), str(N)]
    return lab.popen(host, (NOBODY if as_nobody else []) + argv, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, text=True, env=env)


def test_a_rank_without_root_streams_on_the_engine_beside_a_python_loop_rank(lab8, switch):
    job = job_name("udp-engine")
    procs = [_rank(lab8, lab8.workers[0], job, 0, as_nobody=False, python_loop=True),
             _rank(lab8, lab8.workers[1], job, 1, as_nobody=True, python_loop=False)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out.strip().splitlines()[-1]))
    want = (np.arange(N, dtype=np.int64) * 3).astype(np.int32).tolist()
    assert [o["sum"] == want for o in outs] == [True, True]
    assert [o["loop"] for o in outs] == ["python", "engine"]
    engine = outs[1]["stats"]
    assert engine["results"] == engine["packets_sent"] - engine["retransmissions"] == 41
    # A kick is one sendmmsg: the first window goes as one batch, not one a
    # syscall. After it each RESULT lets out about one packet, as the Python
    # loop rank answers its packets one by one and the udp engine takes no
    # timed sleeps to gather RESULTs (udp_engine_backend.py, UDP_COALESCE):
    # 20-21 kicks for these 41 packets (tests/unit/test_udp_port.py has the
    # batches of a stream against a fast switch).
    assert 0 < engine["tx_kicks"] < engine["packets_sent"] - 8, engine
    assert engine["forged"] == engine["udp_rx_truncated"] == 0


@pytest.mark.parametrize("loss", [0.02, 0.10])
def test_two_engine_ranks_are_exact_through_loss(lab8, switch, loss):
    """Random loss both ways on both ranks' links: exact, resends found by
    evidence as on afxdp (the loss matrix has the counts)."""
    hosts = lab8.workers[:2]    # run_job's
    lab8.set_loss(loss, hosts=hosts)
    try:
        rng = [np.random.default_rng([7, r]) for r in range(2)]
        # 200 packets each way a rank: at 2%, P(no loss at all) < 1e-6
        xs = [g.integers(-2**20, 2**20, 200 * K, dtype=np.int32) for g in rng]

        def body(rank, w):
            assert w.stats()["loop"] == "engine"
            x = xs[rank].copy()
            w.allreduce(x)
            return x, w.stats()

        results = run_job(lab8, job_name(f"udp-engine-loss{int(loss * 100)}"), ["udp", "udp"],
                          body)
    finally:
        lab8.set_loss(0, hosts=hosts)
    for x, _ in results:
        assert np.array_equal(x, xs[0] + xs[1])
    assert sum(st["retransmissions"] for _, st in results) > 0, results[0][1]
