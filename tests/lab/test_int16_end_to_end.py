"""precision="16" end to end against the real XDP switch (lab8, k=256): the
16-bit allreduce is what switchml_xdp.quant16 defines bit for bit and within
bound (B16) of the exact sum; a rank asking for 16 bits against one asking for
32 raises CallMismatch on every rank and the next call is exact. The afxdp
backend's 16-bit jobs: tests/test_int16_afxdp.py."""
from __future__ import annotations

import numpy as np
import pytest

from lab_jobs import K, bench_cli_2_ranks, run_job
from requires import needs_lab
from switchml_xdp import quant, quant16


@needs_lab
@pytest.mark.parametrize("world", [2, 3])
def test_a_16_bit_sum_is_the_reference_and_within_bound(lab8, switch, world):
    n = 100_000
    xs = [(np.random.default_rng([31, r]).standard_normal(n) * 10.0).astype(np.float32)
          for r in range(world)]

    def body(rank, w):
        a = xs[rank].copy()
        w.allreduce(a, precision="16")
        return a

    want = quant16.simulate_allreduce16(xs, K)
    exp_global, _ = quant.global_exponents(xs, K)
    bound = quant16.error_bound16(want, exp_global, world, K)
    exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
    assert np.all(np.abs(want.astype(np.float64) - exact) <= bound)
    for a in run_job(lab8, f"i16-{world}", ["udp"] * world, body):
        assert np.array_equal(a.view(np.uint32), want.view(np.uint32))


@needs_lab
def test_16_against_32_is_a_call_mismatch(lab8, switch):
    from switchml_xdp import CallMismatch

    n = 10_000
    xs = [np.random.default_rng([37, r]).standard_normal(n).astype(np.float32) for r in range(2)]

    def body(rank, w):
        with pytest.raises(CallMismatch):
            w.allreduce(xs[rank].copy(), precision="16" if rank == 0 else "32")
        a = xs[rank].copy()
        w.allreduce(a, precision="16")
        return a

    want = quant16.simulate_allreduce16(xs, K)
    for a in run_job(lab8, "i16-mm", ["udp", "udp"], body):
        assert np.array_equal(a.view(np.uint32), want.view(np.uint32))


@needs_lab
def test_bench_cli_precision_16_verifies(lab8, switch):
    for res in bench_cli_2_ranks(lab8, "i16-bench", 48911, "--precision", "16"):
        assert res["verified"] == 3 and res["verify_failures"] == 0 and res["precision"] == "16"
