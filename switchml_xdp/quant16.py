"""Reference (numpy) definition of the 16-bit block format (float32 <-> int16).

The int32 scheme (switchml_xdp/quant.py, docs/quantization.md) spends 30 - L
bits of every element on headroom so that the switch's int32 sum cannot wrap.
In 16 bits that headroom would cost too much precision at large worlds (at
world 64 a value would keep 8 bits), so the 16-bit format moves the headroom
into the switch instead:

* the exponent round is the int32 scheme's: ``E`` = max over workers of the
  blocks' local exponents (quant.block_exponents, agreed by the switch);
* each worker quantizes with ``F16 = 13 - E``: ``q = int16(rint(x * 2**F16))``,
  ``|q| <= 2**14`` (15 bits with the sign, whatever the world);
* the switch accumulates the int16 contributions in its int32 slot (sign
  extended): ``|S| <= world * 2**14 <= 2**30`` for ``world <= 2**16``, no wrap;
* the RESULT goes back in 16 bits: ``R = (S + 2**(L-1)) >> L`` (arithmetic
  shift, round half up; ``R = S`` when ``L = 0``), ``L = ceil(log2(world))``,
  so ``|R| <= 2**14`` fits int16. The per-element work at the switch is one
  add and one shift; L is the job's (the switch knows its member count);
* each worker: ``y = float32(R * 2**(L - F16))``.

Bound (docs/quantization.md, "The 16-bit format"): per element
``|y - sum x| <= world * 2**(E - 14) + 2**(E + L - 14) + max(2**-24 |y|, 2**-150)``
(the workers' rint, the switch's rounding shift, the final float32 cast).

Shapes are the int32 module's: 2-D ``(nblocks, k)``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import layout, quant

__all__ = [
    "shifts16",
    "quantize16",
    "switch_sum16",
    "dequantize16",
    "simulate_allreduce16",
    "error_bound16",
]

# |x| < 2**(E+1), so |x * 2**(13-E)| < 2**14 and |q| <= 2**14 after rint: one
# bit of margin below int16's 2**15, so the switch's rounded shift of the sum
# stays within int16 too. The rint unit is 2**(E-13).
_TOP_BIT16 = layout.DEFINES["quant.h"]["SWML_TOP_BIT16"]


def shifts16(exp_global: np.ndarray) -> np.ndarray:
    """Fixed-point shift F16 = 13 - E per block (int64 [nblocks])."""
    e = quant._check_exp(exp_global)
    return _TOP_BIT16 - e.astype(np.int64)


def quantize16(x: np.ndarray, k: int, exp_global: np.ndarray) -> np.ndarray:
    """One worker's int16 payloads, shape ``(nblocks, k)``.

    ``q = rint(float64(x) * 2**F16)`` (round half to even); NaN/Inf and padding
    become 0 (the block's non-finite flag makes it NaN everywhere anyway).
    F16 lies in [13 - 127, 13 + 128], so the float64 scaling is exact.
    """
    blocks = quant._blocks(quant._as_f32(x), k)
    f = shifts16(exp_global)
    if f.shape[0] != blocks.shape[0]:
        raise ValueError(f"exp_global has {f.shape[0]} blocks, x has {blocks.shape[0]}")
    wide = blocks.astype(np.float64)
    wide = np.where(np.isfinite(wide), wide, 0.0)
    q = np.rint(np.ldexp(wide, f[:, None]))
    if q.size and np.abs(q).max() > float(1 << (_TOP_BIT16 + 1)):
        raise ValueError(
            "exp_global is smaller than a block's local exponent: "
            "values would not fit the int16 payload"
        )
    return q.astype(np.int16)


def switch_sum16(qs: Sequence[np.ndarray], world: int) -> np.ndarray:
    """What the switch returns: int32 sum of the int16 payloads, shifted back.

    ``R = (S + 2**(L-1)) >> L`` in int32 arithmetic (``>>`` is arithmetic on
    numpy's signed ints, like the C switch's on __s32), as int16.
    """
    if len(qs) == 0:
        raise ValueError("need at least one worker's payload")
    acc = np.zeros(np.asarray(qs[0]).shape, dtype=np.int32)
    for q in qs:
        q = np.asarray(q)
        if q.dtype != np.int16 or q.shape != acc.shape:
            raise ValueError("payloads must be int16 arrays of the same shape")
        np.add(acc, q.astype(np.int32), out=acc)
    L = quant.exponent_bits(world)
    if L:
        acc = (acc + np.int32(1 << (L - 1))) >> np.int32(L)
    return acc.astype(np.int16)


def dequantize16(
    results: np.ndarray,
    exp_global: np.ndarray,
    nonfinite_any: np.ndarray,
    world: int,
    n: int,
) -> np.ndarray:
    """The float32 result (length ``n``) from the switch's int16 RESULTs.

    ``y = float32(float64(R) * 2**(L - F16))``: exact in float64, one rounding
    in the cast. Blocks with the aggregated non-finite flag are all NaN.
    """
    results = np.asarray(results)
    if results.dtype != np.int16 or results.ndim != 2:
        raise ValueError("results must be an int16 array of shape (nblocks, k)")
    return quant.scale_back(results, shifts16(exp_global) - quant.exponent_bits(world),
                            nonfinite_any, n)


def simulate_allreduce16(xs: Sequence[np.ndarray], k: int) -> np.ndarray:
    """What every worker ends up with after a 16-bit allreduce of ``xs``."""
    xs = quant._check_xs(xs)
    world = len(xs)
    exp_global, nonfinite_any = quant.global_exponents(xs, k)
    results = switch_sum16([quantize16(x, k, exp_global) for x in xs], world)
    return dequantize16(results, exp_global, nonfinite_any, world, xs[0].size)


def error_bound16(
    result: np.ndarray, exp_global: np.ndarray, world: int, k: int
) -> np.ndarray:
    """Per-element bound on |result - exact sum| for the 16-bit format.

    ``world * 2**(E - 14) + 2**(E + L - 14) + max(2**-24 |y|, 2**-150)``,
    rounded up; +inf where the result is not finite (as quant.error_bound).
    """
    y = quant._as_f32(result)
    e = quant._check_exp(exp_global).astype(np.int64)
    L = quant.exponent_bits(world)
    n = y.size
    nb = quant.num_blocks(n, k)
    if e.shape != (nb,):
        raise ValueError(f"exp_global has {e.shape[0]} blocks, need {nb}")
    quantization = np.ldexp(float(world), e - 14) + np.ldexp(1.0, e + L - 14)
    return quant.bound_with_cast(y, quantization, k)
