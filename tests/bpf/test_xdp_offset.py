"""The switch's offset-binary sum (SWML_FMT_OFFSET32, swml_wire.h; what every
float32 sum at 32 bits sends) through BPF_PROG_TEST_RUN: contributions within
the format's range [0, 2^(31-L)] are added two elements at a time as one u64
(swml_slot.h, swml_add_pairs), and the result must be every element's own
uint32 sum: no carry may cross from one element into the next, at the range's
ends included, for even and odd k. SUM only; a round of another format
disagrees. quant.to_offset/from_offset give back the int32 sums exactly."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant, wire
from xdp_tester import PROG_K as K
from xdp_tester import Action, SwitchTester, only, require_bpf

ODD_K = 7  # the last element of an odd k is added alone


@pytest.fixture(scope="module")
def odd_prog():
    require_bpf()
    with SwitchTester(k=ODD_K, slots=4) as tester:
        yield tester


def offset_round(sw, job, contributions):
    return sw.round(job, 0, [c.view(np.int32) for c in contributions],
                    fmts=[wire.FMT_OFFSET32] * job.world)


def contributions(rng, world: int, k: int) -> list[np.ndarray]:
    """world payloads in offset binary: random, with each end of the range in
    some lanes for every rank (all of them at the top: the largest sum, 2^31)."""
    top = 2 * quant.offset(world)  # 2^(31-L)
    qs = [rng.integers(0, top + 1, k, dtype=np.int64).astype(np.uint32) for _ in range(world)]
    for q in qs:
        q[0], q[-1] = top, 0
        if k > 2:
            q[1] = top
    return qs


def uint32_sums(qs: list[np.ndarray]) -> np.ndarray:
    return (np.sum(np.stack(qs).astype(np.uint64), axis=0) & 0xFFFFFFFF).astype(np.uint32)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 33, 64])
def test_result_is_each_elements_own_sum(sw, world):
    job = sw.add_job(world=world, slot_count=4)
    qs = contributions(np.random.default_rng(world), world, K)
    run = offset_round(sw, job, qs)
    assert run.action == Action.TX
    res = SwitchTester.result(run)
    assert int(res.header["fmt"]) == wire.FMT_OFFSET32
    got = res.values.view(np.uint32)
    np.testing.assert_array_equal(got, uint32_sums(qs))
    assert int(got.max()) <= 1 << 31  # world <= 2^L elements of at most 2^(31-L)
    assert sw.counters()["completed"] == 1


@pytest.mark.parametrize("world", [2, 3, 64])
def test_odd_k_adds_the_last_element_alone(odd_prog, world):
    odd_prog.reset()
    job = odd_prog.add_job(world=world, slot_count=4)
    qs = contributions(np.random.default_rng(10 + world), world, ODD_K)
    run = offset_round(odd_prog, job, qs)
    assert run.action == Action.TX
    np.testing.assert_array_equal(SwitchTester.result(run).values.view(np.uint32),
                                  uint32_sums(qs))


def test_quantized_floats_come_back_exact_through_the_switch(sw):
    """quant.quantize, to_offset, the switch, from_offset: the int32 sums that
    quant.switch_sum gives, and so quant.simulate_allreduce's floats."""
    world = 3
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(K).astype(np.float32) * 1e3 for _ in range(world)]
    exp = np.max([quant.block_exponents(x, K)[0] for x in xs], axis=0)
    qs = [quant.quantize(x, K, exp, world)[0] for x in xs]
    job = sw.add_job(world=world, slot_count=4)
    run = offset_round(sw, job, [quant.to_offset(q, world).view(np.uint32) for q in qs])
    sums = quant.from_offset(SwitchTester.result(run).values, world)
    np.testing.assert_array_equal(sums, quant.switch_sum(qs))


def test_shadow_reply_carries_the_offset_sum(sw):
    job = sw.add_job(world=2)
    qs = [np.full(K, 5, np.uint32), np.full(K, 2**30, np.uint32)]
    offset_round(sw, job, qs)
    again = sw.run(sw.data(job, 0, 0, qs[0].view(np.int32), fmt=wire.FMT_OFFSET32))
    assert again.action == Action.TX
    res = SwitchTester.result(again)
    assert res.header["flags"] & wire.FLAG_SHADOW
    np.testing.assert_array_equal(res.values.view(np.uint32), uint32_sums(qs))


def test_format_disagreement_marks_the_round(sw):
    job = sw.add_job(world=2)
    run = sw.round(job, 0, [np.ones(K, np.int32), np.ones(K, np.int32)],
                   fmts=[wire.FMT_OFFSET32, wire.FMT_INT32])
    assert SwitchTester.result(run).header["flags"] & wire.FLAG_DISAGREE
    assert sw.counters()["disagreed"] == 1


@pytest.mark.parametrize("op", [wire.OP_MIN, wire.OP_MAX])
def test_offset32_with_min_or_max_is_refused(sw, op):
    job = sw.add_job(world=2)
    run = sw.run(sw.data(job, 0, 0, np.ones(K, np.int32), fmt=wire.FMT_OFFSET32, op=op))
    assert run.action == Action.DROP
    assert sw.counters() == only(rx=1, bad_op=1)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 64])
def test_offset_round_trip_is_exact_at_the_headroom(world):
    """to_offset puts every quantized value (|q| <= 2^(30-L)) in [0, 2^(31-L)];
    from_offset of world such values' uint32 sum is their int32 sum."""
    bound = quant.offset(world)
    qs = [np.array([bound, -bound, 0, 1, -1], np.int32)] * world
    wire_vals = [quant.to_offset(q, world).view(np.uint32) for q in qs]
    assert all(int(v.max()) <= 2 * bound for v in wire_vals)
    got = quant.from_offset(uint32_sums(wire_vals).view(np.int32), world)
    np.testing.assert_array_equal(got, quant.switch_sum(qs))
