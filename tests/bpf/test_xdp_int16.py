"""The switch's int16 step (SWML_FMT_INT16, docs/quantization.md "The 16-bit
format") through BPF_PROG_TEST_RUN: int16 contributions summed in the int32
slot, the RESULT rewritten in place in 16 bits as (sum + 2^(L-1)) >> L, equal to
switchml_xdp.quant16.switch_sum16 bit for bit; its own length checks; SUM only;
a contribution of another format than its round's marks the round DISAGREE."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant16, wire
from xdp_tester import PROG_K as K
from xdp_tester import Action, SwitchTester, only


def int16_round(sw, job, contributions, **kw):
    return sw.round(job, 0, contributions, fmts=[wire.FMT_INT16] * job.world, **kw)


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 33, 64])
def test_result_is_the_reference_shifted_sum(sw, world):
    rng = np.random.default_rng(world)
    job = sw.add_job(world=world, slot_count=4)
    qs = [rng.integers(-(1 << 14), (1 << 14) + 1, K).astype(np.int16) for _ in range(world)]
    qs[0][:2] = [1 << 14, -(1 << 14)]  # the extremes
    run = int16_round(sw, job, qs, exps=[3] * world)
    assert run.action == Action.TX
    res = SwitchTester.result(run)
    assert int(res.header["fmt"]) == wire.FMT_INT16 and int(res.header["exp"]) == 3
    assert len(run.frame) == len(sw.data(job, 0, 0, qs[0], fmt=wire.FMT_INT16))  # in place
    expected = quant16.switch_sum16([q[None, :] for q in qs], world)[0]
    np.testing.assert_array_equal(res.values, expected)
    assert sw.counters()["completed"] == 1


def test_shadow_reply_in_int16(sw):
    job = sw.add_job(world=2)
    qs = [np.full(K, 3, np.int16), np.full(K, -8, np.int16)]
    int16_round(sw, job, qs)
    again = sw.run(sw.data(job, 0, 0, qs[0], fmt=wire.FMT_INT16))
    assert again.action == Action.TX
    res = SwitchTester.result(again)
    assert res.header["flags"] & wire.FLAG_SHADOW
    np.testing.assert_array_equal(res.values, quant16.switch_sum16([q[None] for q in qs], 2)[0])


def test_format_disagreement_marks_the_round(sw):
    job = sw.add_job(world=2)
    run = sw.round(job, 0, [np.ones(K, np.int16), np.ones(K, np.int32)],
                   fmts=[wire.FMT_INT16, wire.FMT_INT32])
    assert run.action == Action.TX
    assert SwitchTester.result(run).header["flags"] & wire.FLAG_DISAGREE
    assert sw.counters()["disagreed"] == 1


def test_int16_with_min_or_max_is_refused(sw):
    job = sw.add_job(world=2)
    run = sw.run(sw.data(job, 0, 0, np.ones(K, np.int16), fmt=wire.FMT_INT16, op=wire.OP_MAX))
    assert run.action == Action.DROP
    assert sw.counters() == only(rx=1, bad_op=1)


def test_int16_length_checks(sw):
    job = sw.add_job(world=2)
    # an int32-long payload with an int16 header, and half of it
    long = sw.data(job, 0, 0, np.ones(K, np.int32), fmt=wire.FMT_INT32)
    hdr_fmt = 14 + 20 + 8 + 3  # the fmt byte: Ethernet, IPv4, UDP, then ver_type, flags, op
    as16 = bytearray(long)
    as16[hdr_fmt] = wire.FMT_INT16
    assert sw.run(bytes(as16)).action == Action.DROP
    short = sw.data(job, 0, 0, np.ones(K, np.int16), fmt=wire.FMT_INT16)
    assert sw.run(short[:-2]).action == Action.DROP
    c = sw.counters()
    assert c["rx"] == 2 and c["bad_ip"] + c["truncated"] == 2
