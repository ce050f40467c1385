"""float32 MIN and MAX through an int32 switch, exactly: an order-preserving map.

The switch compares int32 as signed integers (SWML_OP_MIN/MAX). A float32's
bits, read as an int32, already sort like the floats for non-negative values;
for negative ones the order is reversed, and flipping the 31 low bits puts it
right. The map is its own inverse, so results are the floats' bits, not
approximations: MIN/MAX over the switch are IEEE 754-2019 minimum/maximum,
element by element, which is np.minimum/np.maximum except that -0.0 sorts
just below +0.0 (numpy leaves the sign of max(-0.0, +0.0) unspecified).

NaN propagates per element as in numpy: before mapping, a NaN becomes the one
NaN that wins the op (a positive quiet NaN is above +inf for MAX, a negative
quiet NaN below -inf for MIN).

The worker's C engine implements the same map (worker/quant.c:
swml_ordered_block); tests check the two agree bit for bit.
"""
from __future__ import annotations

import numpy as np

from . import wire

#: The NaN that every NaN input becomes, per op: it wins the comparison.
NAN_FOR_OP = {wire.OP_MAX: np.int32(0x7FC00000),              # +qNaN > +inf
              wire.OP_MIN: np.int32(np.uint32(0xFFC00000).view(np.int32))}  # -qNaN < -inf
_LOW31 = np.int32(0x7FFFFFFF)


def to_ordered(x: np.ndarray, op: int) -> np.ndarray:
    """float32 array -> int32 array whose signed order is the floats' order."""
    if op not in NAN_FOR_OP:
        raise ValueError(f"the order-preserving map is for MIN and MAX, not op {op}")
    bits = np.ascontiguousarray(x, np.float32).view(np.int32).copy()
    bits[np.isnan(x)] = NAN_FOR_OP[op]
    return np.where(bits < 0, bits ^ _LOW31, bits)


def from_ordered(q: np.ndarray) -> np.ndarray:
    """The inverse of to_ordered: int32 -> float32 (the same bits flipped back)."""
    q = np.asarray(q, np.int32)
    return np.where(q < 0, q ^ _LOW31, q).astype(np.int32).view(np.float32)
