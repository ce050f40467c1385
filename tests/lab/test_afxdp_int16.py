"""precision="16" on the afxdp backend: the C engine's 16-bit quantizer
(worker/quant.c) against switchml_xdp.quant16 bit for bit, and lab jobs
against the real XDP switch: afxdp alone and mixed with udp ranks give
quant16's result bit for bit (so within bound (B16)), and a rank asking for 16
bits against one asking for 32 raises CallMismatch on every rank, whatever
backend either runs."""
from __future__ import annotations

import time

import numpy as np
import pytest

from switchml_xdp import quant, quant16

pytest.importorskip("switchml_xdp._engine", reason="the AF_XDP engine is not built")

from engine_calls import bits
from lab_jobs import K, run_job, skip_without_afxdp
from requires import needs_lab

# ----------------------------------------------------------- quantization in C


# ---------------------------------------------------------------- lab jobs

def block_floats(rank: int, n: int) -> np.ndarray:
    """Per-block magnitudes over a wide range, a zero block and a rank-specific
    non-finite element, so that the exponent round and NONFINITE matter."""
    rng = np.random.default_rng([161, rank, n])
    nb = quant.num_blocks(n, K)
    scale = (10.0 ** rng.integers(-30, 30, nb)).repeat(K)[:n]
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if n > 3 * K:
        x[K:2 * K] = 0
        x[2 * K] = -0.0
        x[rng.integers(3 * K, n)] = np.nan if rank % 2 else np.inf
    return x


SIZES = [1, 257, 100_000]
JOBS16 = {"afxdp2": ["afxdp", "afxdp"], "afxdp3": ["afxdp"] * 3,
          "mixed3": ["afxdp", "udp", "afxdp"]}


@needs_lab
@pytest.mark.parametrize("kind", list(JOBS16))
def test_a_16_bit_sum_on_afxdp_is_the_reference_and_within_bound(lab8, switch, kind):
    """The udp backend's result is quant16's bit for bit (test_int16_lab.py):
    afxdp ranks, alone or with udp ranks, must give the same bits."""
    backends = JOBS16[kind]
    skip_without_afxdp(backends)
    world = len(backends)

    def body(rank, w):
        outs = []
        for n in SIZES:
            a = block_floats(rank, n)
            w.allreduce(a, precision="16")
            outs.append(a)
        return outs, w.stats()

    per_rank = run_job(lab8, f"i16-{kind}", backends, body)
    for i, n in enumerate(SIZES):
        xs = [block_floats(r, n) for r in range(world)]
        with np.errstate(invalid="ignore"):
            want = quant16.simulate_allreduce16(xs, K)
        exp_global, _ = quant.global_exponents(xs, K)
        fin = np.isfinite(want)
        exact = np.sum(np.stack(xs).astype(np.float64), axis=0)
        bound = quant16.error_bound16(want, exp_global, world, K)
        assert np.all(np.abs(want[fin].astype(np.float64) - exact[fin]) <= bound[fin])
        for rank, (outs, _) in enumerate(per_rank):
            assert np.array_equal(bits(outs[i]), bits(want)), f"rank {rank} ({backends[rank]}) n={n}"
    for rank, (_, stats) in enumerate(per_rank):
        assert stats["backend"] == backends[rank]


@needs_lab
@pytest.mark.parametrize("backends", [["afxdp", "afxdp"], ["afxdp", "udp"]])
def test_16_against_32_is_a_call_mismatch_on_every_rank(lab8, switch, backends):
    """Both ways round (rank 0 at 16 bits, then rank 1): every rank raises
    CallMismatch within seconds, whichever format the DISAGREE result comes
    in, and the next matching call is exact."""
    from switchml_xdp import CallMismatch

    skip_without_afxdp(backends)
    n = 10_000
    xs = [np.random.default_rng([163, r]).standard_normal(n).astype(np.float32)
          for r in range(2)]

    def body(rank, w):
        took = []
        for sixteen in (0, 1):
            t0 = time.monotonic()
            with pytest.raises(CallMismatch):
                w.allreduce(xs[rank].copy(), precision="16" if rank == sixteen else "32")
            took.append(time.monotonic() - t0)
        a = xs[rank].copy()
        w.allreduce(a, precision="16")
        return a, took

    want = quant16.simulate_allreduce16(xs, K)
    for rank, (a, took) in enumerate(run_job(lab8, f"i16-mm-{'-'.join(backends)}", backends,
                                             body)):
        assert max(took) < 5.0, f"rank {rank} ({backends[rank]}): CallMismatch after {took}"
        assert np.array_equal(bits(a), bits(want)), f"rank {rank} after the mismatches"
