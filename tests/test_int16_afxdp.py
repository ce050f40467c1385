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

try:
    from switchml_xdp import _engine
except ImportError as e:  # pragma: no cover - the build failed or was skipped
    pytest.skip(f"the AF_XDP engine is not built: {e}", allow_module_level=True)

from conftest import needs_lab
from test_afxdp import bits, c_block_exponents, random_floats
from test_worker_v2_lab import K, _skip_without_afxdp, run_job


# ----------------------------------------------------------- quantization in C

def c_quantize16(x: np.ndarray, k: int, exp_global: np.ndarray) -> np.ndarray:
    out = np.empty(exp_global.size * k, np.int16)
    _engine.quantize16(x, k, exp_global, out)
    return out.reshape(-1, k)


def c_dequantize16(results, exp_global, nonfinite, world, n) -> np.ndarray:
    out = np.empty(n, np.float32)
    _engine.dequantize16(np.ascontiguousarray(results).reshape(-1), exp_global, nonfinite,
                         world, out)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_c_quantize16_is_bit_identical_to_quant16_py(seed):
    rng = np.random.default_rng([16, seed])
    for trial in range(40):
        k = int(rng.choice([1, 3, 64, 256, 360]))
        n = int(rng.integers(1, 4000))
        x = random_floats(rng, n, trial % 4)  # every bit pattern, wide, sparse, NaN/Inf
        world = int(rng.integers(1, 65))
        e_loc, _ = c_block_exponents(x, k)
        # A global exponent is the max over workers: >= every local one.
        eg = np.minimum(e_loc.astype(int) + rng.integers(0, 3, e_loc.size), 127).astype(np.int8)
        with np.errstate(invalid="ignore"):
            q_ref = quant16.quantize16(x, k, eg)
        assert np.array_equal(c_quantize16(x, k, eg), q_ref)
        # Any int16 RESULT, not only the ones a switch could send.
        res = rng.integers(-2**15, 2**15, q_ref.shape).astype(np.int16)
        nonfinite = rng.random(eg.size) < 0.1
        y_ref = quant16.dequantize16(res, eg, nonfinite, world, n)
        assert np.array_equal(bits(c_dequantize16(res, eg, nonfinite, world, n)), bits(y_ref))


def test_c_16_bit_pipeline_matches_simulate_allreduce16():
    """Several workers, the switch's sum from quant16: C quantize, C dequantize."""
    rng = np.random.default_rng(1616)
    for world in (1, 2, 3, 5, 64):
        for kind in range(4):
            k, n = 256, 3000
            xs = [random_floats(rng, n, kind) for _ in range(world)]
            eg, nf = quant.global_exponents(xs, k)
            res = quant16.switch_sum16([c_quantize16(x, k, eg) for x in xs], world)
            with np.errstate(invalid="ignore"):
                want = quant16.simulate_allreduce16(xs, k)
            assert np.array_equal(bits(c_dequantize16(res, eg, nf, world, n)), bits(want))


def test_c_quantize16_edge_cases():
    # Ties round half to even, like rint: E = 13 makes F16 = 0.
    x = (np.arange(-40, 40) + 0.5).astype(np.float32)
    eg = np.full(quant.num_blocks(x.size, 64), 13, np.int8)
    assert np.array_equal(c_quantize16(x, 64, eg), quant16.quantize16(x, 64, eg))
    # Exponent extremes, denormals, the largest float, both zeros, NaN/Inf blocks.
    fmax, tiny = np.finfo(np.float32).max, np.finfo(np.float32).tiny
    x = np.array([fmax, -fmax, 1e-45, -1e-45, 0.0, tiny, 2.0**-130, -0.0,
                  np.nan, 1.0, np.inf, -np.inf, -0.0, -0.0, 3e-39, -2.5], np.float32)
    for k in (1, 2, 4, 8, 16):
        e, nf = quant.block_exponents(x, k)
        for eg in (e, np.full_like(e, 127), np.maximum(e, 0).astype(np.int8)):
            with np.errstate(invalid="ignore"):
                q = quant16.quantize16(x, k, eg)
            assert np.array_equal(c_quantize16(x, k, eg), q)
            for world in (1, 2, 3, 64, 65536):
                y = quant16.dequantize16(q, eg, nf, world, x.size)  # q as a RESULT
                assert np.array_equal(bits(c_dequantize16(q, eg, nf, world, x.size)), bits(y))
    # exp -128 (no nonzero finite element but denormals below 2^-128): F16 = 141.
    x = np.array([1e-45, -0.0, 2.0**-128, -(2.0**-129)], np.float32)
    eg = np.full(1, -128, np.int8)
    assert np.array_equal(c_quantize16(x, 4, eg), quant16.quantize16(x, 4, eg))


def test_c_quantize16_refuses_an_exponent_below_the_local_one_like_quant16_py():
    x = np.array([1.0e6, 1.0], np.float32)
    low = np.array([0], np.int8)
    with pytest.raises(ValueError, match="int16 payload"):
        quant16.quantize16(x, 2, low)
    with pytest.raises(ValueError, match="int16 payload"):
        c_quantize16(x, 2, low)
    # One below the local exponent, where |q| = 2^14 still fits: both accept.
    x = np.array([2.0**10], np.float32)
    e = np.array([9], np.int8)
    assert np.array_equal(c_quantize16(x, 1, e), quant16.quantize16(x, 1, e))


def test_c_16_bit_functions_check_their_buffers():
    x = np.zeros(10, np.float32)
    with pytest.raises(TypeError, match="int16"):
        _engine.quantize16(x, 4, np.zeros(3, np.int8), np.empty(12, np.int32))
    with pytest.raises(ValueError, match="outputs"):
        _engine.quantize16(x, 4, np.zeros(3, np.int8), np.empty(11, np.int16))
    with pytest.raises(TypeError, match="int16"):
        _engine.dequantize16(np.zeros(12, np.int32), np.zeros(3, np.int8), np.zeros(3, bool),
                             2, x)


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
    _skip_without_afxdp(backends)
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

    _skip_without_afxdp(backends)
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
