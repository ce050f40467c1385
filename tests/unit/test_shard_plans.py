"""A reduce_scatter's owner bytes in Python (plans.shard_owners, what the udp
backend sends) equal the C engine's (worker/stream.c, what the afxdp engine
sends) packet by packet, for every plan; its call tag and name tell it from
an allreduce of the same tensor."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import wire
from switchml_xdp.client.calls import Call
from switchml_xdp.client.plans import make_plan, shard_owners

_engine = pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")

PLANS = [(np.int32, wire.OP_SUM, wire.FMT_INT32), (np.float32, wire.OP_MAX, wire.FMT_INT32),
         (np.float32, wire.OP_SUM, wire.FMT_OFFSET32), (np.float32, wire.OP_SUM, wire.FMT_INT16)]


@pytest.mark.parametrize("dtype,op,fmt", PLANS)
@pytest.mark.parametrize("n,k,slots,world", [(4096, 256, 8, 4), (1000, 64, 4, 3), (40, 8, 16, 5),
                                             (7, 3, 2, 7), (2048, 256, 64, 2)])
def test_python_and_c_owner_bytes_agree(dtype, op, fmt, n, k, slots, world):
    plan = make_plan(np.zeros(n, dtype), k, slots, world, op, fmt)
    block_lag = -int(plan.block_of(0))  # 0, or the quantized sum's lag
    for shard in {n // world, 1, k, max(1, n // world - 1)}:
        got = shard_owners(plan, n, k, shard, world)
        want = [_engine.shard_owner(p, n, k, block_lag, shard, world)
                for p in range(plan.npackets)]
        assert got.tolist() == want, shard


def test_an_allreduce_has_no_owners_and_a_whole_block_shard_names_each_rank():
    plan = make_plan(np.zeros(4 * 512, np.int32), 256, 8, 4)
    assert not shard_owners(plan, plan.flat.size, 256, 0, 4).any()
    assert shard_owners(plan, plan.flat.size, 256, 512, 4).tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
    fplan = make_plan(np.zeros(4 * 512, np.float32), 256, 3, 4)   # lag 3: exponents first
    assert shard_owners(fplan, 2048, 256, 512, 4).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_a_reduce_scatter_s_tag_covers_its_shards():
    allreduce = Call(3, "j", 1024, "float32", "sum")
    scatter = Call(3, "j", 1024, "float32", "sum", shard=256)
    assert len({allreduce.tag, scatter.tag, Call(3, "j", 1024, "float32", "sum", shard=512).tag}) == 3
    assert str(scatter).startswith("reduce_scatter #3") and str(allreduce).startswith("allreduce #3")
