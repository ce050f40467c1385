"""Properties of the float32 <-> int32 block quantization (docs/quantization.md).

Hypothesis draws the structure (world, k, length, magnitude profile, where the
special values go, a seed) and numpy fills the bulk, so large shapes stay fast;
a second strategy draws every element through hypothesis for small shapes, to
reach its edge values (denormals, FLT_MAX, -0.0, ...).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from switchml_xdp import quant

FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal, 2**-126
DENORM_MIN = float(np.float32(2.0**-149))
KS = [1, 7, 64, 256, 364]
SPECIALS = np.array(
    [0.0, -0.0, 1.0, -1.0, 1e38, -1e38, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN,
     DENORM_MIN, -DENORM_MIN, 2.0**-127, 3.0e-39, 0.5, 1e-30],
    dtype=np.float32,
)

SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# --- input generation ------------------------------------------------------


def _fill(rng: np.random.Generator, mode: str, shape, k: int) -> np.ndarray:
    """float32 inputs of one magnitude profile (finite values only)."""
    w, n = shape
    nb = max(1, -(-n // k))
    sign = rng.choice(np.array([-1.0, 1.0], np.float32), size=shape)
    mant = (1.0 + rng.random(shape)).astype(np.float32)  # [1, 2]
    mant = np.minimum(mant, np.float32(2.0) - np.float32(2.0**-23))
    if mode == "wide":  # every binade, denormals to FLT_MAX, per element
        e = rng.integers(-150, 128, size=shape)
    elif mode == "blocky":  # each block around its own scale, a few binades wide
        centre = np.repeat(rng.integers(-149, 128, size=nb), k)[:n]
        e = np.clip(centre + rng.integers(-12, 1, size=shape), -150, 127)
    elif mode == "huge":
        e = rng.integers(120, 128, size=shape)
    elif mode == "tiny":
        e = rng.integers(-150, -120, size=shape)
    elif mode == "unit":
        e = rng.integers(-3, 3, size=shape)
    elif mode == "ints":
        return rng.integers(-1000, 1001, size=shape).astype(np.float32)
    elif mode == "zeros":
        out = np.zeros(shape, np.float32)
        out[rng.random(shape) < 0.05] = np.float32(-0.0)
        return out
    elif mode == "specials":
        return rng.choice(SPECIALS, size=shape)
    else:
        raise AssertionError(mode)
    x = np.ldexp(sign * mant, e.astype(np.int32))  # float32, rounds denormals
    return x.astype(np.float32)


@st.composite
def inputs(draw, max_world=64, modes=None):
    """(list of W float32 arrays of length n, k)."""
    world = draw(st.integers(1, max_world))
    k = draw(st.sampled_from(KS))
    n = draw(st.integers(0, max(4 * k, 30)))
    seed = draw(st.integers(0, 2**32 - 1))
    modes = modes or ["wide", "blocky", "huge", "tiny", "unit", "ints", "zeros",
                      "specials"]
    mode = draw(st.sampled_from(modes))
    rng = np.random.default_rng(seed)
    data = _fill(rng, mode, (world, n), k)
    if n and draw(st.booleans()):  # sprinkle specials and zeros over a mixture
        mask = rng.random((world, n)) < draw(st.sampled_from([0.01, 0.2]))
        data[mask] = rng.choice(SPECIALS, size=int(mask.sum()))
    if n and draw(st.booleans()):  # some workers all zero
        data[rng.random(world) < 0.3] = 0
    return [data[w].copy() for w in range(world)], k


@st.composite
def small_inputs(draw):
    """Every element drawn by hypothesis (its float edge cases), small shapes."""
    world = draw(st.integers(1, 8))
    k = draw(st.sampled_from(KS[:3]))
    n = draw(st.integers(0, 24))
    data = draw(
        hnp.arrays(
            np.float32,
            (world, n),
            elements=st.floats(width=32, allow_nan=False, allow_infinity=False),
        )
    )
    return [data[w].copy() for w in range(world)], k


def _pipeline(xs, k):
    world = len(xs)
    exp_g, flags = quant.global_exponents(xs, k)
    qs = [quant.quantize(x, k, exp_g, world) for x in xs]
    return exp_g, flags, qs


def _check_within_bound(xs, k, y, exp_g):
    """|y - s| <= error_bound, s the exact sum, compared in float64.

    The float64 sum of W float32 values errs by at most (W-1) 2**-53 sum|x|,
    and the float64 difference by 2**-53 of itself: that slack is added.
    Where y overflowed to +-Inf, the exact sum must be beyond float32's range
    (|s| + Q >= 2**128 - 2**103) with the same sign.
    """
    world = len(xs)
    stack = np.stack(xs).astype(np.float64)
    s = stack.sum(axis=0)
    abs_sum = np.abs(stack).sum(axis=0)
    bound = quant.error_bound(y, exp_g, world, k)
    y64 = y.astype(np.float64)
    fin = np.isfinite(y)
    diff = np.abs(y64[fin] - s[fin])
    slack = world * 2.0**-52 * (abs_sum[fin] + np.abs(y64[fin]))
    bad = diff > bound[fin] + slack
    assert not bad.any(), (
        f"bound violated at {np.flatnonzero(fin)[bad][:5]}: "
        f"diff={diff[bad][:5]} bound={bound[fin][bad][:5]}"
    )
    inf = np.isinf(y)
    if inf.any():
        L = quant.exponent_bits(world)
        e = np.repeat(exp_g.astype(np.int64), k)[: y.size][inf]
        q_term = np.ldexp(float(world), e + L - 30)
        assert np.all(np.abs(s[inf]) + q_term >= 2.0**128 - 2.0**103)
        assert np.all(np.sign(s[inf]) == np.sign(y64[inf]))


# --- the properties -------------------------------------------------------


@SETTINGS
@given(inputs())
def test_int32_sums_never_overflow(case):
    xs, k = case
    world = len(xs)
    L = quant.exponent_bits(world)
    exp_g, _, qs = _pipeline(xs, k)
    for q in qs:
        assert q.dtype == np.int32
        assert q.shape == (quant.num_blocks(xs[0].size, k), k)
        assert np.all(np.abs(q.astype(np.int64)) <= 2 ** (30 - L))
    wrapped = quant.switch_sum(qs).astype(np.int64)
    exact = np.sum(np.stack(qs).astype(np.int64), axis=0)
    assert np.array_equal(wrapped, exact)
    assert np.all(np.abs(exact) <= 2**30)


def test_int32_worst_case_all_flt_max():
    """64 workers at +-FLT_MAX (and W just above a power of two): no wrap."""
    for world in (1, 2, 3, 5, 33, 64):
        for sign in (1, -1):
            xs = [np.full(300, sign * FLT_MAX, np.float32)] * world
            exp_g, _, qs = _pipeline(xs, 64)
            assert np.all(exp_g == 127)
            wrapped = quant.switch_sum(qs).astype(np.int64)
            exact = np.sum(np.stack(qs).astype(np.int64), axis=0)
            assert np.array_equal(wrapped, exact)
            y = quant.simulate_allreduce(xs, 64)
            expect = np.float32(sign * FLT_MAX) if world == 1 else np.float32(sign * np.inf)
            assert np.all(y == expect)


@SETTINGS
@given(inputs())
def test_result_within_error_bound(case):
    xs, k = case
    y = quant.simulate_allreduce(xs, k)
    assert y.dtype == np.float32 and y.shape == xs[0].shape
    assert not np.isnan(y).any()  # finite inputs never give NaN
    exp_g, flags = quant.global_exponents(xs, k)
    assert not flags.any()
    _check_within_bound(xs, k, y, exp_g)


@settings(max_examples=100, deadline=None)
@given(small_inputs())
def test_result_within_error_bound_exact_arithmetic(case):
    """Same bound, checked with exact rationals (no float64 slack at all)."""
    xs, k = case
    y = quant.simulate_allreduce(xs, k)
    exp_g, _ = quant.global_exponents(xs, k)
    bound = quant.error_bound(y, exp_g, len(xs), k)
    for j in range(y.size):
        if np.isinf(y[j]):
            continue  # covered by test_result_within_error_bound
        s = sum(Fraction(float(x[j])) for x in xs)
        assert abs(Fraction(float(y[j])) - s) <= Fraction(float(bound[j])), j


@SETTINGS
@given(inputs(max_world=16, modes=["wide", "blocky", "unit", "ints", "specials"]),
       st.data())
def test_nonfinite_poisons_exactly_its_block(case, data):
    xs, k = case
    n = xs[0].size
    if n == 0:
        return
    world = len(xs)
    # keep the other blocks' sums finite: no overflow to Inf to confuse the check
    xs = [np.clip(x, -1e36, 1e36).astype(np.float32) for x in xs]
    count = data.draw(st.integers(1, 3))
    spots = [
        (data.draw(st.integers(0, world - 1)), data.draw(st.integers(0, n - 1)),
         data.draw(st.sampled_from([np.nan, np.inf, -np.inf])))
        for _ in range(count)
    ]
    for w, j, v in spots:
        xs[w][j] = np.float32(v)
    y = quant.simulate_allreduce(xs, k)
    poisoned = np.zeros(quant.num_blocks(n, k), bool)
    for _, j, _ in spots:
        poisoned[j // k] = True
    elem_poisoned = np.repeat(poisoned, k)[:n]
    assert np.all(np.isnan(y[elem_poisoned]))
    assert np.all(np.isfinite(y[~elem_poisoned]))
    exp_g, flags = quant.global_exponents(xs, k)
    assert np.array_equal(flags, poisoned)
    # the other blocks are exactly what they would be without the bad values
    clean = [x.copy() for x in xs]
    for w, j, _ in spots:
        clean[w][j] = 0
    y_clean = quant.simulate_allreduce(clean, k)
    assert np.array_equal(y[~elem_poisoned], y_clean[~elem_poisoned])
    bound = quant.error_bound(y, exp_g, world, k)
    assert np.all(np.isinf(bound[elem_poisoned]))
    stack = np.stack(xs).astype(np.float64)[:, ~elem_poisoned]
    y64 = y[~elem_poisoned].astype(np.float64)
    diff = np.abs(y64 - stack.sum(axis=0))
    slack = world * 2.0**-52 * (np.abs(stack).sum(axis=0) + np.abs(y64))
    assert np.all(diff <= bound[~elem_poisoned] + slack)


def test_nonfinite_only_block_and_exponent():
    x = np.array([np.nan, np.inf, 0, 0, 3.0, -0.5], np.float32)
    exp, flag = quant.block_exponents(x, 2)
    assert exp.tolist() == [-128, -128, 1]
    assert flag.tolist() == [True, False, False]
    x = np.array([np.inf, 2.0, 0.25], np.float32)
    exp, flag = quant.block_exponents(x, 3)
    assert exp.tolist() == [1] and flag.tolist() == [True]
    q = quant.quantize(x, 3, exp, 1)
    assert q[0, 0] == 0  # the Inf itself quantizes to 0


@SETTINGS
@given(st.integers(1, 64), st.sampled_from(KS), st.integers(0, 800),
       st.integers(0, 2**32 - 1), st.integers(0, 14))
def test_small_integers_are_exact(world, k, n, seed, bits):
    """Integers |x| < 2**bits: every input is a multiple of 2**-F and the sum
    (< 2**20) is a float32, so the allreduce is exact, for any world."""
    rng = np.random.default_rng(seed)
    lim = 2**bits
    data = rng.integers(-lim + 1, lim, size=(world, n)).astype(np.float32)
    xs = list(data)
    y = quant.simulate_allreduce(xs, k)
    assert np.array_equal(y, data.astype(np.float64).sum(axis=0).astype(np.float32))


@SETTINGS
@given(inputs(max_world=1))
def test_single_worker_round_trip(case):
    """W = 1: elements within 6 binades of the block's exponent (or in a
    clamped block) are multiples of 2**-F and come back bit-exact; all others
    within 2**(E-30) + rounding."""
    xs, k = case
    (x,) = xs
    y = quant.simulate_allreduce(xs, k)
    exp, _ = quant.block_exponents(x, k)
    e = np.repeat(exp.astype(np.int64), k)[: x.size]
    _, fe = np.frexp(x)
    x_exp = fe.astype(np.int64) - 1  # floor(log2|x|) for nonzero x
    exact_expected = (x == 0) | (x_exp >= e - 6) | (e == -128)
    assert np.array_equal(y[exact_expected], x[exact_expected] + np.float32(0))
    _check_within_bound(xs, k, y, exp)


@SETTINGS
@given(inputs(max_world=64))
def test_top_binade_is_quantized_exactly(case):
    """For W <= 64 (L <= 6) every element in the block's top binade is a
    multiple of 2**-F: q * 2**-F == x exactly."""
    xs, k = case
    world = len(xs)
    exp_g, _, qs = _pipeline(xs, k)
    f = quant.shifts(exp_g, world)
    for x, q in zip(xs, qs):
        nb = q.shape[0]
        xb = np.zeros(nb * k, np.float64)
        xb[: x.size] = x
        xb = xb.reshape(nb, k)
        top = np.abs(xb) >= np.ldexp(1.0, exp_g.astype(np.int64))[:, None]
        back = np.ldexp(q.astype(np.float64), -f[:, None])
        assert np.array_equal(back[top], xb[top])


@SETTINGS
@given(inputs(max_world=8))
def test_deterministic(case):
    xs, k = case
    xs = [x.copy() for x in xs]
    if xs[0].size:
        xs[0][0] = np.nan
    a = quant.simulate_allreduce(xs, k)
    b = quant.simulate_allreduce([x.copy() for x in xs], k)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    # the integer sum does not depend on the workers' order either
    c = quant.simulate_allreduce(xs[::-1], k)
    assert np.array_equal(a.view(np.uint32), c.view(np.uint32))


@settings(max_examples=100, deadline=None)
@given(small_inputs())
def test_small_elementwise_edge_values(case):
    """Hypothesis' own float32 edge values: no overflow, within bound."""
    xs, k = case
    exp_g, _, qs = _pipeline(xs, k)
    exact = np.sum(np.stack(qs).astype(np.int64), axis=0)
    assert np.array_equal(quant.switch_sum(qs).astype(np.int64), exact)
    y = quant.simulate_allreduce(xs, k)
    _check_within_bound(xs, k, y, exp_g)


# --- unit checks of the definitions -------------------------------------------
