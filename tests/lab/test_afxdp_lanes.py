"""A job's lanes on the afxdp backend (docs/performance.md, "Several queues
per worker"): lane q an engine and an AF_XDP socket on receive queue q,
its RESULTs at the job's port + q, which the network must put on queue q.
The lab's bridge does that on a lab of several queues a link
(lab/steering.py, the stand-in for a NIC's ntuple rules). Exact through it;
a job whose RESULTs land on other queues than its sockets' (RSS on a NIC with
no ntuple rule) is exact too, its engines reading them from the ports' UDP
sockets, and a verbose worker says once what steering it lacks; lanes beyond
the interface's queues are refused at the start. The redirect program's
rule on its own: tests/bpf/test_xdp_redirect_prog.py; the udp backend's
lanes: test_lanes.py."""
from __future__ import annotations

import numpy as np
import pytest

from reliability_helpers import job_name
from requires import needs_lab
from switchml_xdp import quant, wire

pytest.importorskip("switchml_xdp._engine", reason="the AF_XDP engine is not built")
pytestmark = needs_lab

K = 256
N = 200 * K + 9      # 200 blocks and a short one
QUEUES = 2


@pytest.fixture(scope="module")
def lab():
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=2, link_queues=QUEUES) as lab, SwitchProcess(lab):
        yield lab


def reduce_in(lab, job: str, lanes: int, body, port: int = wire.DEFAULT_PORT,
              stall_timeout: float = 30.0) -> list:
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    def rank_body(rank, host):
        with Worker(lab.switch.ip, job, rank, 2, backend="afxdp", verbose=False, port=port,
                    stall_timeout=stall_timeout, lanes=lanes) as w:
            return body(rank, w)

    return run_ranks(lab, lab.workers, rank_body, timeout=120)


def test_the_lab_steers_udp_by_port_on_every_bridge_port(lab):
    from switchml_xdp import bpf
    from switchml_xdp.lab.steering import STEER_PROG

    for host in lab.hosts:
        assert bpf.tc_attachment(host.peer, netns=lab.bridge_ns).name == STEER_PROG


def test_afxdp_lanes_reduce_exactly_each_on_its_own_queue(lab):
    data = [np.random.default_rng([7, r]).standard_normal(N).astype(np.float32) for r in range(2)]
    ints = [np.arange(N, dtype=np.int32) * (r + 1) for r in range(2)]

    def body(rank, w):
        x, y = data[rank].copy(), ints[rank].copy()
        w.allreduce(x)
        w.allreduce(y)
        return x, y, w.stats(), [e.stats() for e in w._backend._engines]

    results = reduce_in(lab, job_name("afxdp-lanes"), QUEUES, body)
    expected = quant.simulate_allreduce(data, K)
    for x, y, stats, lanes in results:
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(y, ints[0] + ints[1])
        assert stats["lanes"] == QUEUES and stats["loop"] == "engine"
        # every RESULT came in on its lane's queue and reached its engine
        assert stats["xdp_misqueued"] == 0 and stats["xdp_redirected"] > 0
        assert stats["stray_results"] == 0
        assert all(lane["results"] > 0 for lane in lanes), lanes


def odd_port_job(lab, job: str, lanes: int) -> list:
    """A 2-rank afxdp job at port 48865, which is odd: the lab puts its
    RESULTs on queue 1 (and port 48866's on queue 0), not on lane 0's (and
    lane 1's) queue, as RSS does on a NIC with no ntuple rule for the port.
    Three calls, float32 and int32; rank 0 verbose. What each rank got."""
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    ints = [np.arange(N, dtype=np.int32) * (r + 1) for r in range(2)]
    data = [np.random.default_rng([9, r]).standard_normal(N).astype(np.float32) for r in range(2)]

    def rank_body(rank, host):
        with Worker(lab.switch.ip, job, rank, 2, backend="afxdp", verbose=rank == 0,
                    port=wire.DEFAULT_PORT + 1, stall_timeout=30.0, lanes=lanes) as w:
            x = data[rank].copy()
            w.allreduce(x)
            first = w.stats()
            for _ in range(2):
                y = ints[rank].copy()
                w.allreduce(y)
            return x, y, first, w.stats()

    results = run_ranks(lab, lab.workers, rank_body, timeout=120)
    expected = quant.simulate_allreduce(data, K)
    for x, y, _, _ in results:
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(y, ints[0] + ints[1])
    return [(first, last) for _, _, first, last in results]


def test_a_lane_s_socket_moves_to_the_queue_its_results_come_in_on(lab, capfd):
    """The first call's RESULTs all land on queue 1: passed to the stack,
    the engine reads them from its port's socket; after it, the socket
    moves to queue 1 and the next calls' come through AF_XDP."""
    for first, last in odd_port_job(lab, job_name("afxdp-moves"), 1):
        assert first["xdp_misqueued"] == first["stray_results"] > 0, first
        assert first["xdp_redirected"] == 0, first
        assert last["stray_results"] == first["stray_results"], last
        assert last["xdp_misqueued"] == first["xdp_misqueued"], last
        assert last["xdp_redirected"] > 0, last
    err = capfd.readouterr().err
    assert err.count("its AF_XDP socket moved there from queue 0") == 1, err
    assert "the RESULTs of port 48865 come in on receive queue 1 of " in err, err
    assert "kernel's UDP path" not in err, err


def test_results_on_queues_no_socket_can_move_to_reach_the_engine_through_the_stack(lab, capfd):
    """Two lanes at 48865: lane 0's RESULTs land on queue 1, lane 1's on
    queue 0, each the other's socket's queue. Neither socket can move, so
    every call's RESULTs take the stack, exact; rank 0 says so once."""
    for first, last in odd_port_job(lab, job_name("afxdp-strays"), QUEUES):
        assert first["xdp_misqueued"] == first["stray_results"] > 0, first
        assert last["stray_results"] > first["stray_results"], last
        assert last["xdp_redirected"] == 0, last
    err = capfd.readouterr().err
    assert err.count("RESULT(s) came in on") == 1, err
    assert "reach the engine through the kernel's UDP path" in err and "`ethtool -N " in err, err
    assert "moved there" not in err, err


def test_a_socket_that_cannot_move_stays_where_it_was(lab):
    """Engine.rebind to a queue the interface lacks: OSError naming it, the
    socket back on its queue, the next call exact through it."""
    ints = [np.arange(N, dtype=np.int32) * (r + 1) for r in range(2)]

    def body(rank, w):
        with pytest.raises(OSError, match=r"queue 7: "):
            w._backend._engines[0].rebind(7)
        y = ints[rank].copy()
        w.allreduce(y)
        return y, w.stats()

    for y, stats in reduce_in(lab, job_name("afxdp-no-move"), 1, body):
        assert np.array_equal(y, ints[0] + ints[1])
        assert stats["xdp_redirected"] > 0 and stats["stray_results"] == 0, stats


def test_lanes_beyond_the_interface_s_queues_are_refused_at_the_start(lab):
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    def rank_body(rank, host):
        Worker(lab.switch.ip, job_name("afxdp-4-lanes"), 0, 1, backend="afxdp", verbose=False,
               lanes=4)

    with pytest.raises(OSError, match=r"lane 2 of 4 takes rx queue 2 of .*, which needs 4 queues: "
                                      r"`ethtool -L .* combined 4`"):
        run_ranks(lab, lab.workers[:1], rank_body, timeout=60)


def test_swml_worker_bench_streams_afxdp_in_lanes(lab):
    from lab_jobs import bench_cli_2_ranks

    rows = bench_cli_2_ranks(lab, job_name("afxdp-lanes-cli"), wire.DEFAULT_PORT,
                             "--lanes", str(QUEUES), "--backend", "afxdp")
    assert [(r["backend"], r["lanes"], r["verify_failures"]) for r in rows] == \
        [("afxdp", QUEUES, 0)] * 2


def test_the_steering_and_the_loss_injector_share_a_port():
    """Both sit on a bridge port's tc ingress, at priorities of their own:
    the injector, attached at run time, leaves the steering in place (it
    used to remove the ports' clsact qdiscs, and the steering with them),
    and the steering lets the injector's filter after it run (it duplicated
    nothing when the steering ended the port's filters); the lanes stay
    exact through the copies."""
    from switchml_xdp import bpf
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess
    from switchml_xdp.lab.steering import STEER_PROG

    with Lab(workers=2, link_queues=QUEUES) as lab, SwitchProcess(lab):
        lab.set_loss(0.0, dup=0.2, direction="up")
        assert all(bpf.tc_attachment(h.peer, netns=lab.bridge_ns).name == STEER_PROG
                   for h in lab.hosts)
        ints = [np.arange(N, dtype=np.int32) * (r + 1) for r in range(2)]

        def body(rank, w):
            y = ints[rank].copy()
            w.allreduce(y)
            return y, w.stats()["xdp_misqueued"]

        results = reduce_in(lab, job_name("afxdp-lanes-dup"), QUEUES, body)
        counters = lab.loss_counters()
    assert all(np.array_equal(y, ints[0] + ints[1]) and misqueued == 0 for y, misqueued in results)
    assert all(counters[h.name]["up"]["duplicated"] > 0 for h in lab.workers), counters
