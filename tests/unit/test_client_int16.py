"""precision="16" on the worker's side: the API's checks, the call tag, and the
udp backend's int16 packing against a fake switch on the loopback (world 1:
the switch's answer is the payload itself, L = 0), bit for bit what
switchml_xdp.quant16 defines."""
from __future__ import annotations

import numpy as np
import pytest

from fake_switch import echo, result_of
from switchml_xdp import quant16, wire
from switchml_xdp.client.calls import Call, call_tag, check_precision
from switchml_xdp.client.plans import Float16Plan, make_plan


def test_precision_16_only_for_a_float32_sum():
    check_precision("16", np.float32, "sum")
    check_precision("32", np.int32, "max")
    for dtype, op in [(np.int32, "sum"), (np.float32, "min"), (np.float32, "max")]:
        with pytest.raises(ValueError, match="only to a float32 sum"):
            check_precision("16", dtype, op)
    for bad in ["8", 16, "bf16", None]:
        with pytest.raises(ValueError, match="precision must be"):
            check_precision(bad, np.float32, "sum")


def test_the_tag_includes_the_precision_and_32_keeps_the_old_tag():
    assert call_tag(1, 10, "float32", "sum") == call_tag(1, 10, "float32", "sum", "32")
    assert call_tag(1, 10, "float32", "sum", "16") != call_tag(1, 10, "float32", "sum")
    assert Call(0, "j", 10, "float32", "sum", "16").fmt == wire.FMT_INT16
    assert Call(0, "j", 10, "float32", "sum").fmt == wire.FMT_OFFSET32
    assert Call(0, "j", 10, "float32", "max").fmt == wire.FMT_INT32
    assert Call(0, "j", 10, "int32", "sum").fmt == wire.FMT_INT32


def test_make_plan_picks_the_16_bit_plan():
    x = np.ones(100, np.float32)
    plan = make_plan(x, 8, 4, 2, wire.OP_SUM, wire.FMT_INT16)
    plan.global_exp[:] = plan.local_exp  # as if the exponent round were done
    assert isinstance(plan, Float16Plan) and plan.payload(plan.lag)[0].dtype == np.int16


def echo16(h, values):
    """World 1: the switch returns the int16 payload as it came (L = 0)."""
    assert int(h["fmt"]) == wire.FMT_INT16
    return echo(h, values)


@pytest.mark.parametrize("n", [1, 8, 200, 1001])
def test_udp_backend_streams_int16_payloads(fake, n):
    sw, be = fake(echo16)
    x = (np.random.default_rng(n).standard_normal(n) * 100).astype(np.float32)
    want = quant16.simulate_allreduce16([x], 8)
    be.allreduce(x, Call(0, "fake", x.size, "float32", "sum", "16"))
    assert np.array_equal(x.view(np.uint32), want.view(np.uint32))
    # half the payload bytes of an int32 packet, every one of them
    assert all(int(h["fmt"]) == wire.FMT_INT16 for h in sw.headers)


def test_an_int32_result_to_an_int16_call_is_ignored(fake):
    """The backend takes only RESULTs in its call's format: a stall, not a wrong result."""
    def int32_answer(h, values):
        return [(False, result_of(h, np.zeros(8, np.int32), fmt=wire.FMT_INT32))]

    sw, be = fake(int32_answer, stall_timeout=0.5)
    x = np.ones(8, np.float32)
    with pytest.raises(TimeoutError, match="no result from the switch"):
        be.allreduce(x, Call(0, "fake", x.size, "float32", "sum", "16"))
    assert np.all(x == 1)
