"""A job's lanes end to end (docs/performance.md, "Several queues per
worker"): ranks on the udp backend's engine, each lane a socket and a
thread on the job's port + lane, through the XDP switch and the user-space
one, on one box and split over both; exact through loss; a rank that asks
for other lanes than its job's is refused in one line. The switch program's
rules: tests/bpf/test_xdp_lanes.py; the engine's: tests/unit/test_lanes.py."""
from __future__ import annotations

import numpy as np
import pytest

from lab_jobs import xdp_and_userspace_boxes
from reliability_helpers import job_name
from requires import needs_lab
from switchml_xdp.client.engine_backend import engine_missing

pytestmark = [needs_lab, pytest.mark.skipif(bool(engine_missing()),
                                            reason=f"the engine is not built: {engine_missing()}")]

K = 256
N = 300 * K + 7      # 300 blocks and a short one


@pytest.fixture(scope="module")
def lab(two_box_lab):
    return two_box_lab


@pytest.fixture(scope="module")
def boxes(lab):
    """Box 0 the XDP switch, box 1 the user-space one."""
    with xdp_and_userspace_boxes(lab) as both:
        yield both


def inputs(seed: int) -> list[np.ndarray]:
    return [np.random.default_rng([seed, r]).standard_normal(N).astype(np.float32)
            for r in range(2)]


def reduce_in(lab, switch, job: str, lanes: int, body, timeout: float = 120.0):
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    def rank_body(rank, host):
        with Worker(switch, job, rank, 2, backend="udp", verbose=False, stall_timeout=30,
                    lanes=lanes) as w:
            assert w.info.lanes == lanes
            return body(rank, w)

    return run_ranks(lab, lab.workers[:2], rank_body, timeout=timeout)


@pytest.mark.parametrize("dataplane", ["xdp", "userspace"])
@pytest.mark.parametrize("lanes", [2, 4])
def test_lanes_reduce_exactly_through_either_data_plane(lab, boxes, dataplane, lanes):
    from switchml_xdp import quant

    box = boxes[0 if dataplane == "xdp" else 1]
    data = inputs(lanes)
    ints = [np.arange(N, dtype=np.int32) * (r + 1) for r in range(2)]

    def body(rank, w):
        x, y, z = data[rank].copy(), ints[rank].copy(), data[rank].copy()
        w.allreduce(x)
        w.allreduce(y)
        w.allreduce(z, precision="16")
        lane_stats = [e.stats() for e in w._backend._engines]
        return x, y, z, w.stats(), lane_stats

    results = reduce_in(lab, box.host.ip, job_name(f"lanes{lanes}-{dataplane}"), lanes, body)
    expected = quant.simulate_allreduce(data, K)
    sixteen = [z for _, _, z, _, _ in results]
    for x, y, z, stats, lane_stats in results:
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(y, ints[0] + ints[1])
        assert np.array_equal(z.view(np.uint32), sixteen[0].view(np.uint32))
        assert stats["loop"] == "engine" and stats["lanes"] == lanes
        # every lane took its RESULTs on its own port, mostly as the
        # switch's RESULTs (to the lane's port), not shadow replies
        assert len(lane_stats) == lanes and all(s["results"] > 0 for s in lane_stats)
        assert stats["results"] - stats["shadow_replies"] >= 0.9 * stats["results"], stats
    assert np.allclose(sixteen[0], data[0] + data[1], atol=1e-2)


def test_lanes_are_exact_through_loss(lab, boxes):
    hosts = lab.workers[:2]
    lab.set_loss(0.05, hosts=hosts)
    try:
        ints = [np.random.default_rng([9, r]).integers(-2**20, 2**20, N, dtype=np.int32)
                for r in range(2)]

        def body(rank, w):
            y = ints[rank].copy()
            w.allreduce(y)
            return y, w.stats()

        results = reduce_in(lab, boxes[0].host.ip, job_name("lanes-loss"), 4, body)
    finally:
        lab.set_loss(0, hosts=hosts)
    for y, _ in results:
        assert np.array_equal(y, ints[0] + ints[1])
    assert sum(st["retransmissions"] for _, st in results) > 0


def test_a_job_over_both_boxes_streams_lanes_to_each(lab, boxes):
    """Box i's lanes start at port + i * lanes: the boxes' ports do not meet."""
    ints = [np.arange(N, dtype=np.int32) - r for r in range(2)]

    def body(rank, w):
        y = ints[rank].copy()
        w.allreduce(y)
        return y, [b.info.port for b in w._boxes]

    both = f"{boxes[0].host.ip},{boxes[1].host.ip}"
    results = reduce_in(lab, both, job_name("lanes-boxes"), 2, body)
    for y, ports in results:
        assert np.array_equal(y, ints[0] + ints[1])
        assert ports[1] == ports[0] + 2


def test_a_rank_that_asks_for_other_lanes_is_refused_in_one_line(lab, boxes):
    from switchml_xdp import Worker
    from switchml_xdp.client.control import ControlError
    from switchml_xdp.lab.cluster import run_ranks

    job = job_name("lanes-mismatch")

    def body(rank, host):
        import time
        time.sleep(rank)   # rank 0 (2 lanes) joins first, rank 1 (1 lane) then
        try:
            with Worker(boxes[0].host.ip, job, rank, 2, backend="udp", verbose=False,
                        lanes=(2, 1)[rank], join_timeout=4):
                return "joined"
        except ControlError as e:
            return str(e)

    first, second = run_ranks(lab, lab.workers[:2], body, timeout=60)
    assert second == (f"join refused: job {job!r} has 2 lane(s), this worker asks for 1: every "
                      f"rank of a job streams in the same lanes"), second
    assert "join refused" in first and "\n" not in second


def test_swml_worker_bench_streams_in_lanes(lab, boxes):
    from lab_jobs import bench_cli_2_ranks

    rows = bench_cli_2_ranks(lab, job_name("lanes-cli"), 47100, "--lanes", "2")
    assert [(r["lanes"], r["loop"], r["verify_failures"]) for r in rows] == [(2, "engine", 0)] * 2


def test_a_lab_of_several_queues_a_link_carries_a_lone_worker_s_lanes():
    """Lab(link_queues=2): both ends of every veth with two queues (what a
    NIC gives each lane); a one-rank job in two lanes through it, exact."""
    from switchml_xdp import Worker
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

    with Lab(workers=1, link_queues=2) as lab, SwitchProcess(lab):
        w0 = lab.workers[0]
        link = lab.run(w0, ["ip", "-d", "link", "show", "dev", w0.iface]).stdout
        assert "numtxqueues 2 numrxqueues 2" in link, link

        def body(rank, host):
            with Worker(lab.switch.ip, job_name("lanes-mq"), 0, 1, backend="udp", verbose=False,
                        lanes=2) as w:
                y = np.arange(N, dtype=np.int32)
                w.allreduce(y)
                return y, [e.stats()["results"] for e in w._backend._engines]

        ((y, per_lane),) = run_ranks(lab, lab.workers, body, timeout=60)
    assert np.array_equal(y, np.arange(N, dtype=np.int32))
    assert all(n > 0 for n in per_lane)


def test_link_queues_out_of_range_are_refused():
    from switchml_xdp.lab import Lab, LabError

    with pytest.raises(LabError, match="link queues must be an integer in 1..16, got 0"):
        Lab(workers=1, link_queues=0)
