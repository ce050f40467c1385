"""The C engine's quantization (int32 and 16-bit blocks) against quant.py and
quant16.py, bit for bit, on every kind of float input; its functions check
their buffers. The same engine over AF_XDP in the lab: tests/lab/test_afxdp.py."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant, quant16

_engine = pytest.importorskip("switchml_xdp._engine", reason="the C engine is not built")

from engine_calls import (  # noqa: E402 - it calls the engine: after the importorskip
    bits,
    c_block_exponents,
    c_dequantize,
    c_dequantize16,
    c_quantize,
    c_quantize16,
    random_floats,
)


@pytest.mark.parametrize("seed", range(8))
def test_c_quantization_is_bit_identical_to_quant_py(seed):
    rng = np.random.default_rng(seed)
    for trial in range(40):
        k = int(rng.choice([1, 3, 64, 256, 364]))
        n = int(rng.integers(1, 4000))
        x = random_floats(rng, n, trial % 4)
        world = int(rng.integers(1, 65))
        e_ref, f_ref = quant.block_exponents(x, k)
        e_c, f_c = c_block_exponents(x, k)
        assert np.array_equal(e_c, e_ref) and np.array_equal(f_c, f_ref)
        # A global exponent is the max over workers: >= every local one.
        eg = np.minimum(e_ref.astype(int) + rng.integers(0, 3, e_ref.size), 127).astype(np.int8)
        with np.errstate(invalid="ignore"):
            q_ref = quant.quantize(x, k, eg, world)
        assert np.array_equal(c_quantize(x, k, eg, world), q_ref)
        sums = rng.integers(-2**31, 2**31, q_ref.shape, dtype=np.int64).astype(np.int32)
        nonfinite = rng.random(eg.size) < 0.1
        y_ref = quant.dequantize(sums, eg, nonfinite, world, n)
        assert np.array_equal(bits(c_dequantize(sums, eg, nonfinite, world, n)), bits(y_ref))


def test_c_quantization_edge_cases():
    # Ties round half to even, like rint: x.5 * 2^0 with F = 0 (world 1, E = 29).
    x = (np.arange(-40, 40) + 0.5).astype(np.float32)
    eg = np.full(quant.num_blocks(x.size, 64), 29, np.int8)
    assert np.array_equal(c_quantize(x, 64, eg, 1), quant.quantize(x, 64, eg, 1))
    # Extremes of the exponent range, denormals, the largest float.
    x = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max, 1e-45, -1e-45, 0.0,
                  np.finfo(np.float32).tiny, 2.0**-130, -0.0], np.float32)
    for k in (1, 2, 8):
        assert np.array_equal(c_block_exponents(x, k)[0], quant.block_exponents(x, k)[0])
        e, _ = quant.block_exponents(x, k)
        for world in (1, 2, 3, 64):
            assert np.array_equal(c_quantize(x, k, e, world), quant.quantize(x, k, e, world))
    assert [_engine.exponent_bits(w) for w in (1, 2, 3, 4, 5, 64, 65536)] == \
           [quant.exponent_bits(w) for w in (1, 2, 3, 4, 5, 64, 65536)]


def test_c_quantize_refuses_an_exponent_below_the_local_one_like_quant_py():
    x = np.array([1.0e6, 1.0], np.float32)
    low = np.array([0], np.int8)
    with pytest.raises(ValueError, match="headroom"):
        quant.quantize(x, 2, low, 4)
    with pytest.raises(ValueError, match="headroom"):
        c_quantize(x, 2, low, 4)
    # Exactly at the limit (x = 2^E_local, one below): both accept.
    x = np.array([2.0**10], np.float32)
    e = np.array([9], np.int8)
    assert np.array_equal(c_quantize(x, 1, e, 2), quant.quantize(x, 1, e, 2))


def test_c_functions_check_their_buffers():
    x = np.zeros(10, np.float32)
    with pytest.raises(TypeError, match="float32"):
        _engine.block_exponents(np.zeros(10, np.float64), 4, np.empty(3, np.int8), np.empty(3, bool))
    with pytest.raises(ValueError, match="blocks"):
        _engine.block_exponents(x, 4, np.empty(2, np.int8), np.empty(3, bool))
    with pytest.raises(ValueError):
        _engine.quantize(x, 4, np.zeros(3, np.int8), 2, np.empty(11, np.int32))


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
