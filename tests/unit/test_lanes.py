"""A job's lanes on the udp backend's engine (docs/performance.md, "Several
queues per worker"): packet i of the job's stream is lane i mod Q's, sent
from the rank's port + lane by that lane's own engine and thread, against a
fake switch on the loopback (world 1: it echoes). Bit for bit what one lane
gives; a loss in one lane is recovered while the others go on; a lane that
fails ends the call on every lane, and the next call runs. The switch's side
is tests/bpf/test_xdp_lanes.py; the lab's, tests/lab/test_lanes.py."""
from __future__ import annotations

import numpy as np
import pytest

from fake_switch import echo, free_port, hold_first_copy_of, result_of
from switchml_xdp import wire
from switchml_xdp.client import plans
from switchml_xdp.client.calls import Call, CallMismatch
from switchml_xdp.client.engine_backend import check_lanes, engine_missing

needs_engine = pytest.mark.skipif(bool(engine_missing()),
                                  reason=f"the udp backend's engine: {engine_missing()}")
K, SLOTS = 8, 16


def free_ports(n: int) -> int:
    """A port p with p..p+n-1 free on the loopback (now)."""
    import socket
    for _ in range(50):
        p = free_port()
        socks = []
        try:
            for q in range(n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", p + q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


@pytest.fixture
def lanes_job(fake_on):
    def make(answer, lanes: int, engine: bool = True):
        return fake_on(answer, engine, k=K, slots=SLOTS, lanes=lanes, port=free_ports(lanes))
    return make


def _call(x, precision="32", op="sum", n=0):
    return Call(n, "fake", x.size, str(x.dtype), op, precision)


@needs_engine
@pytest.mark.parametrize("lanes", [2, 4])
def test_each_lane_sends_its_slots_from_its_own_port(lanes_job, lanes):
    sw, be = lanes_job(echo, lanes)
    x = np.arange(40 * K + 3, dtype=np.int32)
    be.allreduce(x, _call(x))
    assert np.array_equal(x, np.arange(40 * K + 3))
    port = be.info.port
    seen = {(int(h["slot"]), src[1]) for h, src in zip(sw.headers, sw.sources)}
    assert {p - port for _, p in seen} == set(range(lanes))
    assert all(p == port + slot % lanes for slot, p in seen), sorted(seen)
    stats = be.stats()
    assert stats["lanes"] == lanes and stats["results"] == 41
    # every lane carried its share
    assert [e.stats()["results"] for e in be._engines] == [
        len(range(q, 41, lanes)) for q in range(lanes)]


@needs_engine
@pytest.mark.parametrize("precision", ["32", "16"])
@pytest.mark.parametrize("n", [5, 3 * K + 1, 40 * K + 3])   # one block, fewer than lanes, many
def test_a_float_sum_over_lanes_is_one_lane_s_bit_for_bit(lanes_job, precision, n):
    """The lag of a float32 sum is rounded up to the lanes (plans.lag_of):
    which packet carries a block changes, no value does."""
    rng = np.random.default_rng(n)
    x0 = rng.standard_normal(n).astype(np.float32)
    out = {}
    for lanes in (1, 4):
        _, be = lanes_job(echo, lanes)
        for call in range(3):   # the stream goes on across calls
            x = x0 * (call + 1)
            be.allreduce(x, _call(x, precision, n=call))
            out[lanes, call] = x
    for call in range(3):
        assert out[1, call].tobytes() == out[4, call].tobytes()


@needs_engine
def test_a_packet_lost_in_one_lane_is_recovered_while_the_others_go_on(lanes_job):
    sw, be = lanes_job(hold_first_copy_of(5), 4)   # packet 5: lane 1's
    x = np.arange(64 * K, dtype=np.int32)
    be.allreduce(x, _call(x))
    assert np.array_equal(x, np.arange(64 * K))
    lane_stats = [e.stats() for e in be._engines]
    assert lane_stats[1]["retransmissions"] >= 1
    assert [s["retransmissions"] for i, s in enumerate(lane_stats) if i != 1] == [0, 0, 0]


def disagree_on(seq_held: int):
    def answer(h, values):
        flags = int(h["flags"]) & wire.FLAG_SLOT_VER
        if int(h["seq"]) == seq_held:
            flags |= wire.FLAG_DISAGREE
        return [(False, result_of(h, values, flags=flags))]
    return answer


@needs_engine
def test_a_lane_that_fails_ends_the_call_on_every_lane_and_the_next_call_runs(lanes_job):
    sw, be = lanes_job(disagree_on(6), 4)
    x = np.arange(200 * K, dtype=np.int32)
    with pytest.raises(CallMismatch):
        be.allreduce(x, _call(x))
    # every lane moved on to the same point past the call (stream.c, resync_index)
    at = {e.next_index for e in be._engines}
    assert len(at) == 1 and at.pop() % (2 * SLOTS) == 0
    assert be.next_index >= wire.SEQ_RESYNC_STRIDE
    y = np.arange(10 * K, dtype=np.int32)
    be.allreduce(y, _call(y, n=1))
    assert np.array_equal(y, np.arange(10 * K))


def test_the_packet_count_over_lanes_is_the_engine_s_twin():
    e = pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")
    for n in (1, 7, 8, 9, 100, 1000):
        for slots in (1, 4, 16, 64):
            for lanes in (1, 2, 4):
                if slots % lanes:
                    continue
                for is_float, dtype in ((True, np.float32), (False, np.int32)):
                    for op in (wire.OP_SUM, wire.OP_MAX):
                        assert e.packets(n, K, slots, is_float, op, lanes) == \
                            plans.packets_needed(n, dtype, K, slots, op, lanes)
    assert plans.lag_of(3, 16, 4) == 4 and plans.lag_of(3, 16, 1) == 3
    assert plans.lag_of(30, 16, 4) == 16


@pytest.mark.parametrize("lanes", [0, 3, 6, 32, True, 2.0])
def test_lanes_not_a_power_of_two_in_range_get_a_one_line_reason(lanes):
    with pytest.raises(ValueError, match="lanes must be a power of two in 1..16"):
        check_lanes(lanes)


def test_the_python_loop_streams_one_lane(lanes_job):
    with pytest.raises(RuntimeError, match="streams one lane, and job 'fake' has 2"):
        lanes_job(echo, 2, engine=False)
