"""Degenerate calls (no element, one element) on the worker's side, without a
lab: what the front end hands the backends (plans.streamed), that it is what
both datapaths can stream (the C engine's rule on formats, its packet count),
and that the udp backend streams an empty call as the one-element call of its
dtype, op and precision, with the tag of count 0, against a fake switch that
echoes (world 1). tests/lab/test_degenerate_calls.py runs them in a mixed job."""
from __future__ import annotations

import numpy as np
import pytest

from fake_switch import echo
from switchml_xdp import wire
from switchml_xdp.client.calls import Call, call_tag
from switchml_xdp.client.plans import make_plan, packets_needed, streamed

try:
    from switchml_xdp import _engine
except ImportError:  # the C engine is optional (SWML_SKIP_ENGINE=1)
    _engine = None

K, SLOTS = 8, 4  # the fake switch's (tests/unit/conftest.py)
# (dtype, op, precision): every combination allreduce takes (calls.check_precision).
KINDS = [("int32", "sum", "32"), ("int32", "min", "32"), ("int32", "max", "32"),
         ("float32", "sum", "32"), ("float32", "sum", "16"), ("float32", "min", "32"),
         ("float32", "max", "32")]
EMPTY_SHAPES = [(0,), (0, 3), (2, 0)]
ONE_SHAPES = [(1,), (), (1, 1)]


@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("shape", EMPTY_SHAPES + ONE_SHAPES + [(3, 5)])
def test_streamed_is_the_array_flat_or_one_zero_of_its_dtype(dtype, shape):
    x = np.ones(shape, dtype)
    flat = streamed(x)
    assert flat.ndim == 1 and flat.dtype == x.dtype and flat.flags.c_contiguous
    if x.size:
        assert flat.size == x.size and np.shares_memory(flat, x)
    else:
        assert flat.size == 1 and flat[0] == 0


@pytest.mark.parametrize("dtype, op, precision", KINDS)
def test_an_empty_call_is_one_every_datapath_can_stream(dtype, op, precision):
    """The engine takes SWML_FMT_INT16 and SWML_FMT_OFFSET32 only with a
    float32 buffer and SUM (worker/engine_module.c): an empty float32 sum
    streamed as int32 was refused there while udp sent it, and a mixed job
    fell out of step for good."""
    call = Call(0, "j", 0, dtype, op, precision)
    flat = streamed(np.zeros(0, dtype))
    assert call.fmt == wire.FMT_INT32 or (flat.dtype == np.float32 and op == "sum")
    one = np.zeros(1, dtype)
    plan, plan_one = (make_plan(a, K, SLOTS, 2, call.op_code, call.fmt) for a in (flat, one))
    assert type(plan) is type(plan_one) and plan.npackets == plan_one.npackets >= 1
    assert plan.npackets == packets_needed(flat.size, flat.dtype, K, SLOTS, call.op_code)


@pytest.mark.skipif(_engine is None, reason="the C engine is not built")
@pytest.mark.parametrize("dtype, op, precision", KINDS)
@pytest.mark.parametrize("shape", EMPTY_SHAPES + ONE_SHAPES)
def test_both_datapaths_count_the_same_packets(dtype, op, precision, shape):
    call = Call(0, "j", 0, dtype, op, precision)
    flat = streamed(np.zeros(shape, dtype))
    plan = make_plan(flat, K, SLOTS, 2, call.op_code, call.fmt)
    assert plan.npackets == _engine.packets(flat.size, K, SLOTS, dtype == "float32", call.op_code)


@pytest.mark.parametrize("dtype, op, precision", KINDS)
def test_an_empty_call_streams_as_the_one_element_call_with_its_own_tag(fake, dtype, op,
                                                                          precision):
    sw, be = fake(echo)

    def first_sends():
        """DATA sent once (a resend, the tail probe's when the fake switch's
        thread is late under load, is flagged and may come after clear())."""
        return [h for h in sw.headers if not int(h["flags"]) & wire.FLAG_RETRANS]

    x = np.zeros((0, 3), dtype)
    empty = Call(0, "fake", x.size, dtype, op, precision)
    be.allreduce(streamed(x), empty)
    assert x.shape == (0, 3) and x.dtype == np.dtype(dtype)
    sent, after_empty = first_sends(), be.next_index
    assert sent and after_empty == len(sent)
    assert {(int(h["tag"]), int(h["op"]), int(h["fmt"])) for h in sw.headers} == \
        {(call_tag(0, 0, dtype, op, precision), empty.op_code, empty.fmt)}
    sw.headers.clear()
    one = np.array([-3], dtype)
    be.allreduce(streamed(one), Call(1, "fake", 1, dtype, op, precision))
    assert one[0] == -3  # world 1: the value itself, exactly
    assert be.next_index - after_empty == len(first_sends()) == len(sent)
