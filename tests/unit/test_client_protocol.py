"""The worker's half of wire format v2, without a lab: call tags,
seq arithmetic through the wrap and the resync after a failed call, the float32
MIN/MAX map in C and Python, the ports both backends hold, and which RESULTs
the udp backend takes, against a fake switch on the loopback that answers
with crafted datagrams."""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from fake_switch import GROUP, free_port, honest, result_of
from switchml_xdp import ordered, wire
from switchml_xdp.client.calls import (
    Call,
    CallMismatch,
    CallSpan,
    call_tag,
    check_length,
    op_code,
    resync_index,
)
from switchml_xdp.client.plans import make_plan, packets_needed
from switchml_xdp.client.port import PortInUse, reserve_port
from switchml_xdp.client.retransmit import RetransmitPolicy

try:
    from switchml_xdp import _engine
except ImportError:  # the C engine is optional (SWML_SKIP_ENGINE=1)
    _engine = None
needs_engine = pytest.mark.skipif(_engine is None, reason="the C engine is not built")

STRIDE = wire.SEQ_RESYNC_STRIDE

# ------------------------------------------------------------------ call tags


def test_call_tag_is_the_same_for_the_same_call_and_differs_otherwise():
    base = call_tag(7, 1000, np.float32, "sum")
    assert base == call_tag(7, 1000, "float32", "sum") and 0 <= base < 2**32
    others = [call_tag(8, 1000, np.float32, "sum"), call_tag(7, 1001, np.float32, "sum"),
              call_tag(7, 1000, np.int32, "sum"), call_tag(7, 1000, np.float32, "max"),
              call_tag(7, 1000, np.float32, "min")]
    assert base not in others and len(set(others)) == len(others)
    # Pinned: every rank, in every process and version, computes this value.
    assert call_tag(0, 1, "int32", "sum") == call_tag(0, 1, np.dtype("int32"), "sum")


def test_call_names_itself_and_its_error():
    call = Call(7, "j1", 1000, "float32", "sum")
    assert str(call) == "allreduce #7 of job 'j1' (1000 float32, sum)"
    assert call.tag == call_tag(7, 1000, "float32", "sum") and call.op_code == wire.OP_SUM
    err = call.mismatch()
    assert isinstance(err, CallMismatch) and isinstance(err, RuntimeError)
    assert str(err).startswith("allreduce #7 of job 'j1' (1000 float32, sum): the ranks did not "
                               "make the same call (length, dtype or op differ")


def test_call_mismatch_is_exported_from_the_package():
    from switchml_xdp import CallMismatch as Public

    assert Public is CallMismatch


@pytest.mark.parametrize("op", ["avg", "SUM", None, 0])
def test_bad_op_is_a_value_error(op):
    with pytest.raises(ValueError, match="op must be one of sum, min, max"):
        op_code(op)


# ------------------------------------------------------- seq through the wrap


def test_seq_is_seq_base_plus_the_packet_counter_modulo_2_32():
    span = CallSpan(start=10, npackets=300, seq_base=2**32 - 100)
    assert span.seq(0) == 2**32 - 90 and span.seq(89) == 2**32 - 1 and span.seq(90) == 0
    for p in (0, 89, 90, 299):
        assert span.packet_of(span.seq(p)) == p
    assert span.packet_of(span.seq(0) - 1) is None        # the call before
    assert span.packet_of(span.seq(299) + 1) is None      # the call after
    assert span.packet_of((span.seq(0) + 2**31) & 0xFFFFFFFF) is None


def test_resync_lands_past_the_stride_on_a_boundary_of_both_versions():
    for slots in (1, 3, 64, 1024):
        for start in (0, 1, 2 * slots - 1, 12345, 2**40 + 7):
            r = resync_index(start, slots)
            assert r % (2 * slots) == 0
            assert start + STRIDE <= r < start + STRIDE + 2 * slots
    # Ranks that started the failed call at the same packet go on together.
    assert resync_index(4096, 64) == resync_index(4096, 64) == 4096 + STRIDE


def test_a_call_longer_than_the_stride_is_refused():
    call = Call(0, "j", 10, "int32", "sum")
    check_length(call, STRIDE, 256)
    with pytest.raises(ValueError, match=r"needs 16777217 packets .*split the tensor"):
        check_length(call, STRIDE + 1, 256)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 100_000])
@pytest.mark.parametrize("dtype, op", [(np.int32, wire.OP_SUM), (np.int32, wire.OP_MAX),
                                       (np.float32, wire.OP_SUM), (np.float32, wire.OP_MIN)])
def test_packet_counts_agree_between_the_plan_the_count_and_the_engine(n, dtype, op):
    k, slots = 256, 64
    expect = packets_needed(n, dtype, k, slots, op)
    if n:
        assert make_plan(np.zeros(n, dtype), k, slots, 2, op).npackets == expect
    if _engine is not None:
        assert _engine.packets(n, k, slots, dtype == np.float32, op) == expect


# ------------------------------------------------- float32 MIN/MAX: the map


def special_floats() -> np.ndarray:
    bits = np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000,
                     0x3F800000, 0xBF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000,
                     0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
                     0x7FA00000], dtype=np.uint32)
    rng = np.random.default_rng(11)
    return np.concatenate([bits, rng.integers(0, 2**32, 200_000, dtype=np.uint32)]).view(np.float32)


@needs_engine
@pytest.mark.parametrize("op", [wire.OP_MIN, wire.OP_MAX])
def test_the_engine_map_is_bit_identical_to_ordered_py(op):
    x = special_floats()
    q = np.empty(x.size, np.int32)
    _engine.ordered(x, op, q)
    assert np.array_equal(q, ordered.to_ordered(x, op))
    back = np.empty(x.size, np.float32)
    _engine.unordered(q, back)
    assert np.array_equal(back.view(np.int32), ordered.from_ordered(q).view(np.int32))
    with pytest.raises(ValueError, match="MIN and MAX"):
        _engine.ordered(x, wire.OP_SUM, q)


def ieee_reduce(op: str, xs) -> np.ndarray:
    """IEEE 754-2019 minimum/maximum over ranks: numpy's minimum/maximum (NaN
    wins), except that -0.0 < +0.0 (numpy keeps either zero of a tie)."""
    ref = np.minimum if op == "min" else np.maximum
    out = xs[0]
    for x in xs[1:]:
        out = ref(out, x)
    zero = out == 0
    signs = np.stack([np.signbit(x) & (x == 0) for x in xs])
    neg = signs.any(axis=0) if op == "min" else ~(np.stack([~np.signbit(x) & (x == 0)
                                                            for x in xs]).any(axis=0))
    out[zero] = np.where(neg[zero], np.float32(-0.0), np.float32(0.0))
    return out


@pytest.mark.parametrize("op", ["min", "max"])
def test_min_max_plans_give_ieee_minimum_maximum_bit_for_bit(op):
    """Three ranks' plans, combined as the switch does (signed int32 compare):
    the bits of IEEE minimum/maximum (numpy's, with -0.0 < +0.0), NaN, inf and
    -0.0 included."""
    rng = np.random.default_rng(5)
    n, k, slots = 1000, 64, 4
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    xs[0][:9] = [np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45, 3.0, 0.0]
    xs[1][:9] = [1.0, 0.0, -0.0, 5.0, 7.0, -1e-45, 1e-45, -np.nan, 0.0]
    xs[2][:9] = [2.0, -0.0, -0.0, -np.inf, np.inf, 0.0, 0.0, 3.0, 0.0]
    combine = np.minimum if op == "min" else np.maximum
    outs = [x.copy() for x in xs]
    plans = [make_plan(o, k, slots, 3, op_code(op)) for o in outs]
    for p in range(plans[0].npackets):
        payloads = [pl.payload(p)[0] for pl in plans]
        agg = payloads[0]
        for q in payloads[1:]:
            agg = combine(agg, q)  # int32, signed: the switch's SWML_OP_MIN/MAX
        for pl in plans:
            pl.result(p, agg, 0, 0)
    for pl in plans:
        pl.finish()
    expect = ieee_reduce(op, xs)
    nan = np.isnan(expect)
    assert nan[0] and nan[7] and nan.sum() == 2
    for o in outs:
        assert np.array_equal(np.isnan(o), nan)
        assert np.array_equal(o[~nan].view(np.int32), expect[~nan].view(np.int32))
        assert np.signbit(o[1]) == np.signbit(o[2]) == (op == "min")  # -0.0 < +0.0
        assert not np.signbit(o[8])


# ---------------------------------------------------------------- ports


def test_a_held_port_is_refused_to_a_second_binder_even_with_reuse_options():
    port = free_port()
    held = reserve_port(port, GROUP, "127.0.0.1")
    try:
        with pytest.raises(PortInUse, match=f"^UDP port {port} is in use on this host "
                                            r"\(by another rank or program\): "):
            reserve_port(port, GROUP, "127.0.0.1")
        for opts in ((socket.SO_REUSEADDR,), (socket.SO_REUSEPORT,),
                     (socket.SO_REUSEADDR, socket.SO_REUSEPORT)):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
                for opt in opts:
                    other.setsockopt(socket.SOL_SOCKET, opt, 1)
                for addr in ("0.0.0.0", "127.0.0.1"):
                    with pytest.raises(OSError, match="in use"):
                        other.bind((addr, port))
        assert held.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 0
        assert held.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 0
    finally:
        held.close()
    reserve_port(port, GROUP, "127.0.0.1").close()  # free again once released


# ------------------------------------ the udp backend against a fake switch


def test_every_data_packet_carries_key_op_fmt_tag_and_seq(fake):
    sw, be = fake(honest, seq_base=2**32 - 5)
    call = Call(4, "fake", 100, "int32", "max")
    x = np.arange(100, dtype=np.int32)
    be.allreduce(x, call)
    assert np.array_equal(x, np.arange(100, dtype=np.int32))
    # 13 packets; a resend (the fake switch's thread late under load: CI once
    # saw one) carries the same fields and is counted as one.
    assert be.next_index == 13
    assert len(sw.headers) == 13 + be.stats()["retransmissions"], be.stats()
    seqs = sorted({int(h["seq"]) for h in sw.headers}, key=lambda s: (s - (2**32 - 5)) % 2**32)
    assert seqs == [(2**32 - 5 + p) % 2**32 for p in range(13)]  # through the wrap
    for h in sw.headers:
        assert int(h["key"]) == 0x0123456789ABCDEF and int(h["tag"]) == call.tag
        assert (int(h["op"]), int(h["fmt"]), int(h["job"])) == (wire.OP_MAX, wire.FMT_INT32, 3)
        p = (int(h["seq"]) - (2**32 - 5)) % 2**32
        assert int(h["slot"]) == p % 4 and bool(h["flags"] & wire.FLAG_SLOT_VER) == bool(p // 4 % 2)


def forgeries(h, values):
    """What an attacker or a confused network may deliver before the switch's
    answer: wrong values behind every flaw a check must catch."""
    bad = values + 1000
    seq = int(h["seq"])
    return [
        (True, result_of(h, bad)),                                    # not from the switch's port
        (False, result_of(h, bad, job=int(h["job"]) + 1)),            # another job
        (False, result_of(h, bad, tag=int(h["tag"]) ^ 1)),            # another call
        (False, result_of(h, bad, op=(int(h["op"]) + 1) % 3)),        # another op
        (False, result_of(h, bad, seq=(seq + 1000) & 0xFFFFFFFF)),    # not a packet of the call
        (False, result_of(h, bad, slot=(int(h["slot"]) + 1) % 4)),    # the seq on another slot
        (False, result_of(h, bad, kind=wire.TYPE_DATA)),              # not a RESULT
        (False, result_of(h, bad, fmt=1)),                            # another payload format
        (False, result_of(h, bad)[:-4]),                              # short
        (False, result_of(h, values)),                                # the switch's answer
        (False, result_of(h, bad)),                                   # a late copy: duplicate
    ]


@pytest.mark.parametrize("dtype, op", [(np.int32, "sum"), (np.float32, "sum"), (np.float32, "min")])
def test_only_the_switchs_result_of_the_packet_in_flight_counts(fake, dtype, op):
    # Timers out of the way (eleven datagrams a packet, each checked: on a
    # loaded machine the adaptive 5 ms floor fired): what is taken is the test.
    patient = RetransmitPolicy(initial_s=2.0, min_s=2.0, max_s=2.0, adaptive=False)
    sw, be = fake(forgeries, seq_base=2**32 - 7, policy=patient)
    x = (np.random.default_rng(3).standard_normal(200) * 100).astype(dtype)
    want = x.copy()
    if dtype == np.float32 and op == "sum":  # world 1: quantized once
        from switchml_xdp import quant
        want = quant.simulate_allreduce([x], 8)
    be.allreduce(x, Call(0, "fake", x.size, np.dtype(dtype).name, op))
    assert np.array_equal(x.view(np.uint32), want.view(np.uint32))
    st = be.stats()
    n = packets_needed(x.size, dtype, 8, 4, op_code(op))
    assert st["results"] == n and st["retransmissions"] == 0
    assert st["ignored"] == 9 * n and st["duplicates"] >= n - 1


def test_a_disagreeing_result_raises_call_mismatch_and_resyncs(fake):
    state = {"disagree": True}

    def answer(h, values):
        if state["disagree"]:  # the round's tag is another rank's
            return [(False, result_of(h, values, tag=int(h["tag"]) ^ 0x5A5A,
                                      flags=wire.FLAG_DISAGREE | (int(h["flags"]) & 1)))]
        return honest(h, values)

    sw, be = fake(answer, seq_base=0xFFFFFF00)
    be.next_index = 40  # some calls before this one
    call = Call(3, "fake", 1000, "int32", "sum")
    t0 = time.monotonic()
    with pytest.raises(CallMismatch, match=r"^allreduce #3 of job 'fake' \(1000 int32, sum\): "
                                           "the ranks did not make the same call"):
        be.allreduce(np.ones(1000, np.int32), call)
    assert time.monotonic() - t0 < 1.0
    assert be.next_index == resync_index(40, 4) == 40 + STRIDE
    # The next call (every rank resynced alike) goes on from there and is exact.
    state["disagree"] = False
    sw.headers.clear()
    x = np.arange(1000, dtype=np.int32)
    be.allreduce(x, Call(4, "fake", 1000, "int32", "sum"))
    assert np.array_equal(x, np.arange(1000, dtype=np.int32))
    assert min(int(h["seq"]) for h in sw.headers) == (0xFFFFFF00 + 40 + STRIDE) % 2**32
    assert be.next_index == 40 + STRIDE + 125


def test_a_timeout_resyncs_too(fake):
    sw, be = fake(lambda h, v: [], stall_timeout=0.3)
    be.next_index = 8
    with pytest.raises(TimeoutError, match="no result from the switch for 0.3 s"):
        be.allreduce(np.ones(100, np.int32), Call(0, "fake", 100, "int32", "sum"))
    assert be.next_index == resync_index(8, 4)


def test_forged_results_do_not_hold_off_the_stall_clock(fake):
    """A stream of foreign datagrams does not keep a call waiting forever."""
    def flood(h, values):
        return [(True, result_of(h, values))] * 50

    sw, be = fake(flood, stall_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        be.allreduce(np.ones(8, np.int32), Call(0, "fake", 8, "int32", "sum"))
    assert time.monotonic() - t0 < 3.0 and be.stats()["retransmissions"] > 0


def test_a_too_long_call_is_refused_before_anything_is_sent(fake):
    sw, be = fake(honest, k=1, slots=1)
    x = np.zeros(STRIDE + 1, np.int32)
    with pytest.raises(ValueError, match="needs 16777217 packets of 1 elements"):
        be.allreduce(x, Call(0, "fake", x.size, "int32", "sum"))
    assert be.next_index == 0 and be.stats()["packets_sent"] == 0 and not sw.headers


def test_the_udp_backend_holds_its_port(fake):
    sw, be = fake(honest)
    with pytest.raises(PortInUse, match=f"UDP port {be.info.port} is in use"):
        reserve_port(be.info.port, GROUP, "127.0.0.1")


# ---------------------------------------------------------------- sum plans
