"""Reference (numpy) implementation of the float32 <-> int32 block quantization.

The switch can only add int32 vectors (one packet = one block of ``k`` elements)
and take the max of a signed 8-bit ``exp`` field. Floats therefore travel as
int32 fixed point with one exponent per block, agreed through the switch (max
over workers). The scheme, its error bound and why the int32 sums can never
overflow are documented in docs/quantization.md; this module is the executable
definition of that text. The C worker engine must be bit-identical to it, so
every step here is a single, exactly specified IEEE operation:

* ``E_local`` = floor(log2(max |x|)) over the block's finite elements (frexp
  exponent - 1), clamped to [-128, 127]; -128 for an all-zero block.
* ``E`` = max over workers of ``E_local`` (done by the switch), ``L`` =
  ceil(log2(world)), ``F = 29 - L - E``.
* ``q = int32(rint(ldexp(float64(x), F)))`` (round half to even); non-finite
  elements and padding quantize to 0.
* ``y = float32(ldexp(float64(S), -F))`` for the switch's int32 sum ``S``; a
  block in which any worker saw a NaN/Inf becomes all NaN.

Everything is vectorised over blocks and elements (2-D arrays of shape
``(nblocks, k)``); only :func:`simulate_allreduce` loops, over workers.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import layout

__all__ = [
    "EXP_MIN",
    "EXP_MAX",
    "MAX_WORLD",
    "exponent_bits",
    "num_blocks",
    "block_exponents",
    "global_exponents",
    "shifts",
    "quantize",
    "offset",
    "to_offset",
    "from_offset",
    "switch_sum",
    "dequantize",
    "simulate_allreduce",
    "error_bound",
]

_Q = layout.DEFINES["quant.h"]   # worker/quant.h: the one definition, shared with the C engine
#: Range of the header's signed 8-bit ``exp`` field; local exponents are clamped
#: to it. -128 also marks "nothing to scale" (all-zero / all-non-finite block).
EXP_MIN = _Q["SWML_EXP_MIN"]
EXP_MAX = _Q["SWML_EXP_MAX"]

#: Largest world the arithmetic supports: ranks are u16 on the wire. (The switch
#: itself allows fewer workers per job; the scheme only needs L <= 30.)
MAX_WORLD = 1 << 16

# Headroom: |q| <= 2**(30 - L), so the sum of world <= 2**L values is <= 2**30.
_TOP_BIT = _Q["SWML_TOP_BIT"]


def exponent_bits(world: int) -> int:
    """L = ceil(log2(world)) (0 for a single worker).

    These are the bits of headroom reserved so that the int32 sum of ``world``
    quantized values cannot overflow: each value is scaled to at most
    ``2**(30 - L)`` in magnitude, and ``world <= 2**L`` of them sum to at most
    ``2**30 < 2**31``.
    """
    world = _check_world(world)
    return (world - 1).bit_length()


def num_blocks(n: int, k: int) -> int:
    """Number of k-element blocks (packets) for n elements: the last is padded."""
    return -(-int(n) // _check_k(k))


def block_exponents(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Local exponent and non-finite flag of every block of one worker's tensor.

    Returns ``(exp, nonfinite)``: ``exp`` is int8 ``[nblocks]`` with
    ``floor(log2(max |x_j|))`` over the block's *finite* elements, clamped to
    [-128, 127] (the i8 ``exp`` header field); -128 if the block has no nonzero
    finite element. ``nonfinite`` is bool ``[nblocks]``, set where the block has
    a NaN or +-Inf (this becomes header flag bit 2, OR-ed by the switch).

    Ignoring non-finite elements keeps the exponent meaningful for the other
    workers' data in that block (the block ends up NaN anyway, but exp travels
    one window ahead and must stay within range). floor(log2(m)) is taken from
    frexp (m = f * 2**e, 0.5 <= f < 1 -> e - 1), which is exact, unlike log2.
    """
    blocks = _blocks(_as_f32(x), k)
    finite = np.isfinite(blocks)
    mag = np.where(finite, np.abs(blocks), np.float32(0))
    peak = mag.max(axis=1, initial=np.float32(0))
    _, e = np.frexp(peak)  # exact, also for float32 denormals
    exp = np.where(peak > 0, e.astype(np.int64) - 1, EXP_MIN)
    exp = np.clip(exp, EXP_MIN, EXP_MAX).astype(np.int8)
    nonfinite = ~finite.all(axis=1)
    return exp, nonfinite


def global_exponents(
    xs: Sequence[np.ndarray], k: int
) -> tuple[np.ndarray, np.ndarray]:
    """What the switch hands back: max of the local exponents, OR of the flags.

    Returns ``(exp_global int8 [nblocks], nonfinite_any bool [nblocks])`` for
    the workers' tensors ``xs`` (all of the same length).
    """
    xs = _check_xs(xs)
    pairs = [block_exponents(x, k) for x in xs]
    exp_global = np.max(np.stack([p[0] for p in pairs]), axis=0).astype(np.int8)
    nonfinite_any = np.any(np.stack([p[1] for p in pairs]), axis=0)
    return exp_global, nonfinite_any


def shifts(exp_global: np.ndarray, world: int) -> np.ndarray:
    """Fixed-point shift F = 29 - L - E per block (int64 [nblocks]).

    A value x of the block satisfies |x| < 2**(E + 1), so |x * 2**F| < 2**(30 - L).
    F lies in [29 - 16 - 127, 29 + 128] = [-114, 157] here, so 2**F and every
    product below stay far inside float64's normal range: scaling is exact.
    """
    e = _check_exp(exp_global)
    return (_TOP_BIT - exponent_bits(world)) - e.astype(np.int64)


def quantize(
    x: np.ndarray, k: int, exp_global: np.ndarray, world: int
) -> np.ndarray:
    """One worker's int32 payloads, shape ``(nblocks, k)``.

    ``q = rint(float64(x) * 2**F)`` with F from :func:`shifts` (round half to
    even, the default IEEE mode, i.e. C's ``rint``/``nearbyint``). The float64
    scaling by a power of two is exact (ldexp, no overflow or underflow for the
    F range), so the only rounding is rint's, with error <= 1/2 in units of
    2**-F. NaN/Inf and the last block's padding become 0: a non-finite block is
    NaN on every worker anyway, and zeros keep the int32 sum bounded.
    """
    blocks = _blocks(_as_f32(x), k)
    f = shifts(exp_global, world)
    if f.shape[0] != blocks.shape[0]:
        raise ValueError(
            f"exp_global has {f.shape[0]} blocks, x has {blocks.shape[0]}"
        )
    wide = blocks.astype(np.float64)
    wide = np.where(np.isfinite(wide), wide, 0.0)
    scaled = np.ldexp(wide, f[:, None])
    q = np.rint(scaled)
    # Cannot fail for exps computed by block_exponents + max: |q| <= 2**(30-L).
    # A wrong (too small) exp_global would otherwise wrap silently.
    limit = float(1 << (30 - exponent_bits(world)))
    if q.size and np.abs(q).max() > limit:
        raise ValueError(
            "exp_global is smaller than a block's local exponent: "
            "values would not fit the int32 headroom"
        )
    return q.astype(np.int32)


def offset(world: int) -> int:
    """The offset of SWML_FMT_OFFSET32 (swml_wire.h): 2**(30-L), the bound of |q|.

    A sender adds it to each payload element, which then lies in
    ``[0, 2**(31-L)]``; ``world <= 2**L`` of them sum below ``2**32``, so the
    switch may add two elements as one u64 without a carry crossing between
    them. Receivers take ``world * offset`` off the sum again.
    """
    return 1 << (30 - exponent_bits(world))


def to_offset(q: np.ndarray, world: int) -> np.ndarray:
    """int32 payloads in offset binary, as SWML_FMT_OFFSET32 sends them (the
    same bits as uint32 q + offset, viewed as int32)."""
    q = np.asarray(q, dtype=np.int32)
    return (q.view(np.uint32) + np.uint32(offset(world))).view(np.int32)


def from_offset(sums: np.ndarray, world: int) -> np.ndarray:
    """The int32 sums back from a SWML_FMT_OFFSET32 result: world offsets off."""
    sums = np.asarray(sums, dtype=np.int32)
    total = np.uint32((world * offset(world)) & 0xFFFFFFFF)
    return (sums.view(np.uint32) - total).view(np.int32)


def switch_sum(qs: Sequence[np.ndarray]) -> np.ndarray:
    """Sum int32 payloads exactly as the switch does: int32 with wrap-around.

    The switch adds in 32-bit two's complement; this keeps the same semantics
    (numpy int32 array addition wraps) so tests can show that no wrap happens.
    """
    if len(qs) == 0:
        raise ValueError("need at least one worker's payload")
    acc = np.array(qs[0], dtype=np.int32, copy=True)
    for q in qs[1:]:
        q = np.asarray(q)
        if q.dtype != np.int32 or q.shape != acc.shape:
            raise ValueError("payloads must be int32 arrays of the same shape")
        np.add(acc, q, out=acc)
    return acc


def dequantize(
    sums: np.ndarray,
    exp_global: np.ndarray,
    nonfinite_any: np.ndarray,
    world: int,
    n: int,
) -> np.ndarray:
    """The float32 result (length ``n``) from the switch's int32 sums.

    ``y = float32(float64(S) * 2**-F)``: S has at most 31 significant bits, so
    the float64 product is exact and the final cast is the single rounding
    (to nearest even; it may give +-Inf only if the true sum is beyond
    float32's range). Blocks whose aggregated non-finite flag is set become
    all NaN, identically on every worker. Padding is dropped.
    """
    sums = np.asarray(sums)
    if sums.dtype != np.int32 or sums.ndim != 2:
        raise ValueError("sums must be an int32 array of shape (nblocks, k)")
    return scale_back(sums, shifts(exp_global, world), nonfinite_any, n)


def scale_back(ints: np.ndarray, f: np.ndarray, nonfinite_any: np.ndarray, n: int) -> np.ndarray:
    """float32(float64(ints) * 2**-f) per block, NaN blocks, padding dropped:
    the last step of both formats (quant16.dequantize16 too)."""
    nb, k = ints.shape
    flags = np.asarray(nonfinite_any, dtype=bool)
    if f.shape != (nb,) or flags.shape != (nb,):
        raise ValueError("exp_global and nonfinite_any need one entry per block")
    n = int(n)
    if not (nb - 1) * k < n <= nb * k and not (n == 0 and nb == 0):
        raise ValueError(f"n={n} does not fit {nb} blocks of {k}")
    wide = np.ldexp(ints.astype(np.float64), -f[:, None])
    with np.errstate(over="ignore"):
        y = wide.astype(np.float32)
    y[flags] = np.float32(np.nan)
    return y.reshape(-1)[:n]


def simulate_allreduce(xs: Sequence[np.ndarray], k: int) -> np.ndarray:
    """What every worker ends up with after an allreduce of ``xs`` via the switch.

    Local exponents per worker, max over workers (the switch's ``exp``), OR of
    the non-finite flags, quantize each worker, int32 wrap-around sum (the
    switch's arithmetic), dequantize. Returns float32 of the common length.
    """
    xs = _check_xs(xs)
    world = len(xs)
    n = xs[0].size
    exp_global, nonfinite_any = global_exponents(xs, k)
    sums = switch_sum([quantize(x, k, exp_global, world) for x in xs])
    return dequantize(sums, exp_global, nonfinite_any, world, n)


def error_bound(
    result: np.ndarray, exp_global: np.ndarray, world: int, k: int
) -> np.ndarray:
    """Per-element bound on |result - exact sum of the workers' inputs|.

    float64 array of ``len(result)``:
    ``world * 2**(E + L - 30) + max(2**-24 * |y|, 2**-150)``, where E is the
    block's global exponent and y the element of ``result``. The first term is
    the quantization (each worker's rint errs by <= 2**(-F-1) = 2**(E+L-30));
    the second the final rounding to float32 (half an ulp: relative 2**-24 in
    the normal range, 2**-150 absolute among denormals). It is +inf where the
    result is NaN (a non-finite input: no bound applies) or +-Inf (the exact
    sum is beyond float32's range). The float64 value is rounded up, so it is
    never below the real-valued bound. Derivation: docs/quantization.md.

    Everything it needs is known to a worker after the allreduce.
    """
    y = _as_f32(result)
    e = _check_exp(exp_global).astype(np.int64)
    L = exponent_bits(world)
    n = y.size
    nb = num_blocks(n, k)
    if e.shape != (nb,):
        raise ValueError(f"exp_global has {e.shape[0]} blocks, need {nb}")
    return bound_with_cast(y, np.ldexp(float(world), e + L - 30), k)  # exact


def bound_with_cast(y: np.ndarray, per_block: np.ndarray, k: int) -> np.ndarray:
    """A per-block quantization bound plus the float32 cast's half ulp of the
    float32 result y, per element, rounded up; +inf where y is not finite.
    The common tail of (B) and (B16)."""
    n = y.size
    quant = np.repeat(per_block, k)[:n]
    mag = np.abs(y.astype(np.float64))
    with np.errstate(invalid="ignore"):
        cast = np.maximum(np.ldexp(mag, -24), np.ldexp(1.0, -150))
    bound = np.nextafter(quant + cast, np.inf)
    bound[~np.isfinite(y)] = np.inf
    return bound


# --- helpers -----------------------------------------------------------------


def _check_world(world: int) -> int:
    w = int(world)
    if w != world or not 1 <= w <= MAX_WORLD:
        raise ValueError(f"world must be an integer in [1, {MAX_WORLD}], got {world!r}")
    return w


def _check_k(k: int) -> int:
    kk = int(k)
    if kk != k or kk < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return kk


def _check_exp(exp_global: np.ndarray) -> np.ndarray:
    e = np.asarray(exp_global)
    if e.ndim != 1 or e.dtype.kind not in "iu":
        raise ValueError("exp_global must be a 1-D integer array (int8 values)")
    if e.size and (e.min() < EXP_MIN or e.max() > EXP_MAX):
        raise ValueError("exp_global out of the int8 range")
    return e


def _as_f32(x: np.ndarray) -> np.ndarray:
    """The tensor as a flat float32 view (C order); other dtypes are refused,
    because a silent conversion would change the values being reduced."""
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"expected a float32 array, got {a.dtype}")
    return a.reshape(-1)


def _blocks(flat: np.ndarray, k: int) -> np.ndarray:
    """Shape (nblocks, k), the last block zero-padded."""
    k = _check_k(k)
    nb = num_blocks(flat.size, k)
    pad = nb * k - flat.size
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, dtype=flat.dtype)])
    return flat.reshape(nb, k)


def _check_xs(xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    xs = [_as_f32(x) for x in xs]
    if not xs:
        raise ValueError("need at least one worker")
    _check_world(len(xs))
    if any(x.size != xs[0].size for x in xs):
        raise ValueError("all workers' tensors must have the same length")
    return xs
