"""The 16-bit block format (switchml_xdp/quant16.py, docs/quantization.md
"The 16-bit format"): the result is within the stated bound of the exact sum
for random inputs at worlds 1..64, the switch's shifted sum always fits int16,
and the int16 arithmetic never wraps."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from switchml_xdp import quant, quant16

PROFILES = ["normal", "wide", "tiny", "mixed_signs_equal"]


def _inputs(rng, world, n, profile):
    if profile == "normal":
        return [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    if profile == "wide":
        return [(rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(np.float32)
                for _ in range(world)]
    if profile == "tiny":
        return [(rng.standard_normal(n) * 1e-40).astype(np.float32) for _ in range(world)]
    # every worker holds the block's largest magnitude: the sum's worst case
    x = np.full(n, np.float32(3.0e38 / 64), dtype=np.float32)
    return [x * np.float32(rng.choice([-1, 1])) for _ in range(world)]


def _exact(xs):
    return np.sum(np.stack([x.astype(np.float64) for x in xs]), axis=0)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 8, 13, 16, 31, 32, 33, 63, 64])
def test_result_within_bound(world, profile):
    rng = np.random.default_rng(world * 101 + len(profile))
    k = 64
    n = 1000
    xs = _inputs(rng, world, n, profile)
    y = quant16.simulate_allreduce16(xs, k)
    exp_global, _ = quant.global_exponents(xs, k)
    bound = quant16.error_bound16(y, exp_global, world, k)
    err = np.abs(y.astype(np.float64) - _exact(xs))
    assert np.all(err <= bound), float((err - bound).max())


def test_bound_exact_arithmetic():
    """The float64 'exact' sum above can round; check one case with Fractions."""
    rng = np.random.default_rng(7)
    world, k = 64, 16
    xs = [(rng.standard_normal(40) * 1e3).astype(np.float32) for _ in range(world)]
    y = quant16.simulate_allreduce16(xs, k)
    exp_global, _ = quant.global_exponents(xs, k)
    bound = quant16.error_bound16(y, exp_global, world, k)
    for j in range(40):
        exact = sum(Fraction(float(x[j])) for x in xs)
        assert abs(Fraction(float(y[j])) - exact) <= Fraction(float(bound[j]))


@pytest.mark.parametrize("world", [1, 2, 64, 1 << 16])
def test_switch_result_fits_int16(world):
    """Every worker at +2**14 (the largest payload): no wrap, R <= 2**14."""
    q = np.full((1, 8), 1 << 14, dtype=np.int16)
    r = quant16.switch_sum16([q] * min(world, 64), world)
    assert r.dtype == np.int16
    assert np.all(r >= 0) and np.all(r <= (1 << 14))
    neg = quant16.switch_sum16([-q] * min(world, 64), world)
    assert np.all(neg <= 0) and np.all(neg >= -(1 << 14))


def test_nonfinite_block_is_nan_everywhere():
    xs = [np.ones(8, np.float32), np.ones(8, np.float32)]
    xs[1][3] = np.inf
    y = quant16.simulate_allreduce16(xs, 4)
    assert np.all(np.isnan(y[:4])) and np.all(y[4:] == 2.0)


def test_too_small_exponent_refused():
    x = np.full(4, 8.0, dtype=np.float32)
    with pytest.raises(ValueError):
        quant16.quantize16(x, 4, np.array([0], dtype=np.int8))
