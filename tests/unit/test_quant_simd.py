"""The C engine's vector quantization kernels (worker/quant_simd.c, AVX2)
against quant.py and quant16.py, bit for bit, at every level the CPU has, on
the inputs where float32 arithmetic could part from float64's: every
exponent, zeros, denormals, Inf/NaN blocks, a last block shorter than k and
the exponents that make the results subnormal or overflow. The one-pass
calls (offset folded in, the payload read where it lies in the frame) run
through the engine's micro loop, which checks its own RESULTs."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant, quant16, wire

_engine = pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")

import engine_calls as calls  # noqa: E402 - it calls the engine: after the importorskip

BEST = _engine.quant_simd()
KS = (1, 7, 15, 16, 17, 64, 256, 360)
WORLDS = (1, 2, 3, 64, 65536)


@pytest.fixture(params=[0, 1], ids=["none", "avx2"])
def level(request):
    """Each vector level in turn; the CPU's best again afterwards."""
    got = _engine.quant_simd(request.param)
    try:
        if got != request.param:
            pytest.skip(f"this CPU runs vector level {got} at most, not {request.param}")
        yield got
    finally:
        _engine.quant_simd(BEST)


def every_exponent(rng, k: int) -> np.ndarray:
    """One block per binary exponent of float32 (denormals included), its
    peak 2^e and the rest spread below it, some exact ties, a zero block, an
    Inf block, a NaN block, and a last block of k // 2 + 1."""
    blocks = []
    for e in range(-149, 128):
        b = (rng.random(k) * 2.0 - 1.0) * np.ldexp(1.0, e)
        b[0] = np.ldexp(1.0, e)
        b[1 % k] = np.ldexp(1.5, e - 3)  # a tie at many shifts
        blocks.append(b.astype(np.float32))
    zero = np.zeros(k, np.float32)
    inf = rng.standard_normal(k).astype(np.float32)
    inf[-1] = np.inf
    nan = rng.standard_normal(k).astype(np.float32)
    nan[0] = np.nan
    tail = rng.standard_normal(k // 2 + 1).astype(np.float32)
    return np.concatenate([*blocks, zero, inf, nan, tail])


def inputs(rng, k: int):
    yield every_exponent(rng, k)
    for kind in range(4):
        yield calls.random_floats(rng, int(rng.integers(1, 3 * k + 2)), kind)


@pytest.mark.parametrize("k", KS)
def test_quantize_is_bit_identical_at_every_level(level, k):
    rng = np.random.default_rng(k)
    for x in inputs(rng, k):
        e, nonfinite = quant.block_exponents(x, k)
        e_c, nonfinite_c = calls.c_block_exponents(x, k)
        assert np.array_equal(e_c, e) and np.array_equal(nonfinite_c, nonfinite)
        # a global exponent may exceed the local one (another worker's max)
        eg = np.minimum(e.astype(int) + rng.integers(0, 4, e.size), 127).astype(np.int8)
        for world in WORLDS:
            with np.errstate(invalid="ignore"):
                assert np.array_equal(calls.c_quantize(x, k, eg, world),
                                      quant.quantize(x, k, eg, world))
        with np.errstate(invalid="ignore"):
            assert np.array_equal(calls.c_quantize16(x, k, eg), quant16.quantize16(x, k, eg))


@pytest.mark.parametrize("k", KS)
def test_dequantize_is_bit_identical_at_every_level(level, k):
    """Every global exponent, so the float64 fallback (subnormal results) and
    the overflow to Inf are crossed; full-range sums, a short last block."""
    rng = np.random.default_rng(1000 + k)
    eg = np.arange(-128, 128, dtype=np.int8)
    n = eg.size * k - k // 2
    nonfinite = rng.random(eg.size) < 0.05
    sums = rng.integers(-2**31, 2**31, (eg.size, k), dtype=np.int64).astype(np.int32)
    sums[:, 0] = np.resize(np.array([-2**31, 2**31 - 1, 1, -1, 0], np.int32), eg.size)
    r16 = rng.integers(-2**15, 2**15, (eg.size, k), dtype=np.int64).astype(np.int16)
    for world in WORLDS:
        y = quant.dequantize(sums, eg, nonfinite, world, n)
        got = calls.c_dequantize(sums, eg, nonfinite, world, n)
        assert np.array_equal(calls.bits(got), calls.bits(y))
        y16 = quant16.dequantize16(r16, eg, nonfinite, world, n)
        got16 = calls.c_dequantize16(r16, eg, nonfinite, world, n)
        assert np.array_equal(calls.bits(got16), calls.bits(y16))


@pytest.mark.parametrize("fmt", ["offset32", "int16"])
@pytest.mark.parametrize("one_pass", [False, True], ids=["stream_calls", "one_pass"])
def test_engine_loop_matches_the_reference(level, fmt, one_pass):
    """The engine's per-packet path (quantize into a frame, the switch's
    sum of world copies, parse, authenticate, dequantize from the frame)
    gives quant.py's allreduce of those copies, for every kind of input."""
    code = {"offset32": wire.FMT_OFFSET32, "int16": wire.FMT_INT16}[fmt]
    rng = np.random.default_rng(7)
    for k in (15, 256):
        for x in inputs(rng, k):
            for world in (1, 3, 64):
                y = np.empty_like(x)
                _engine.engine_micro(x, y, k, world, code, wire.AUTH_FULL, 1, one_pass)
                with np.errstate(invalid="ignore", over="ignore"):
                    want = (quant16.simulate_allreduce16([x] * world, k) if fmt == "int16"
                            else quant.simulate_allreduce([x] * world, k))
                assert np.array_equal(calls.bits(y), calls.bits(want)), (k, world)


def test_engine_micro_refuses_bad_arguments():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="engine_micro"):
        _engine.engine_micro(x, np.empty_like(x), _engine.MAX_K + 1, 1, wire.FMT_OFFSET32,
                             wire.AUTH_HEADER, 1, True)
    with pytest.raises(ValueError, match="as long as x"):
        _engine.engine_micro(x, np.empty(9, np.float32), 4, 1, wire.FMT_OFFSET32,
                             wire.AUTH_HEADER, 1, True)
    with pytest.raises(TypeError, match="int32"):
        _engine.engine_micro(x, np.empty_like(x), 4, 1, wire.FMT_INT32, wire.AUTH_HEADER, 1,
                             True)
