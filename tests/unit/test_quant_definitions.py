"""quant.py's definitions checked one by one on small hand-made cases: exponent
bits, block exponents, quantize, dequantize, padding, the error bound formula.
The properties over random inputs: tests/unit/test_quant.py."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import quant

FLT_MAX = float(np.finfo(np.float32).max)
DENORM_MIN = float(np.float32(2.0**-149))


def test_exponent_bits():
    assert [quant.exponent_bits(w) for w in (1, 2, 3, 4, 5, 8, 9, 63, 64, 65)] == [
        0, 1, 2, 2, 3, 3, 4, 6, 6, 7]
    with pytest.raises(ValueError):
        quant.exponent_bits(0)


def test_block_exponents_definition():
    x = np.array(
        [1.0, -0.75, 0.0, 0.0, FLT_MAX, 1e38, DENORM_MIN, 0.0, 2.0**-127, 3.0,
         -4.0],
        np.float32,
    )
    exp, flag = quant.block_exponents(x, 2)
    # [1, -0.75] -> 0; zeros -> -128; FLT_MAX -> 127; denormal -> clamped -128;
    # [2**-127, 3] -> 1; [-4, pad] -> 2
    assert exp.dtype == np.int8 and flag.dtype == bool
    assert exp.tolist() == [0, -128, 127, -128, 1, 2]
    assert not flag.any()
    assert quant.block_exponents(np.array([2.0**-128], np.float32), 1)[0].tolist() == [-128]
    assert quant.block_exponents(np.array([2.0**-126], np.float32), 1)[0].tolist() == [-126]
    assert quant.block_exponents(np.array([0.99999994], np.float32), 1)[0].tolist() == [-1]
    e, f = quant.block_exponents(np.zeros(0, np.float32), 7)
    assert e.shape == (0,) and f.shape == (0,)


def test_quantize_definition():
    # W = 3: L = 2, block exp 0 -> F = 27
    x = np.array([1.0, -1.5, 2.0**-28, 3 * 2.0**-28, 0.0], np.float32)
    exp = np.array([0, -128], np.int8)
    q = quant.quantize(x, 4, exp, 3)
    assert q.dtype == np.int32 and q.shape == (2, 4)
    # 2**-28 * 2**27 = 0.5 -> 0 (half to even); 1.5 -> 2
    assert q[0].tolist() == [2**27, -3 * 2**26, 0, 2]
    assert q[1].tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError):  # exponent too small: would not fit
        quant.quantize(x, 4, np.array([-1, -128], np.int8), 3)
    with pytest.raises(TypeError):
        quant.quantize(x.astype(np.float64), 4, exp, 3)


def test_dequantize_definition():
    sums = np.array([[2**29, -(2**30), 1, 0], [5, 0, 0, 0]], np.int32)
    exp = np.array([0, 3], np.int8)
    y = quant.dequantize(sums, exp, np.array([False, True]), 1, 6)
    # W = 1: F = 29 - E
    assert y.dtype == np.float32 and y.shape == (6,)
    assert y[:4].tolist() == [1.0, -2.0, 2.0**-29, 0.0]
    assert np.all(np.isnan(y[4:]))
    with pytest.raises(ValueError):
        quant.dequantize(sums, exp, np.array([False, True]), 1, 9)


def test_padding_and_zero_length():
    assert quant.simulate_allreduce([np.zeros(0, np.float32)] * 3, 64).shape == (0,)
    x = np.arange(1, 11, dtype=np.float32)
    q = quant.quantize(x, 4, quant.block_exponents(x, 4)[0], 1)
    assert q.shape == (3, 4) and q[2, 2:].tolist() == [0, 0]
    assert np.array_equal(quant.simulate_allreduce([x, x], 4), 2 * x)


def test_error_bound_formula():
    y = np.array([1.0, 0.0, np.nan, np.inf, 2.0**-140], np.float32)
    exp = np.array([0, 0, 3, -128, -128], np.int8)
    b = quant.error_bound(y, exp, 5, 1)  # L = 3
    assert b[0] >= 5 * 2.0**-27 + 2.0**-24 and b[0] == np.nextafter(5 * 2.0**-27 + 2.0**-24, 1)
    assert b[1] == np.nextafter(5 * 2.0**-27 + 2.0**-150, 1)
    assert np.isinf(b[2]) and np.isinf(b[3])
    assert b[4] == np.nextafter(5 * 2.0**-155 + 2.0**-150, 1)
