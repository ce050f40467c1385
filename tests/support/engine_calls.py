"""The C engine's quantization functions called the way the tests call them
(output arrays made here), and float inputs of every kind, for the tests that
pin the engine to quant.py and quant16.py bit for bit."""
from __future__ import annotations

import numpy as np

from switchml_xdp import _engine, quant


def c_block_exponents(x: np.ndarray, k: int):
    nb = quant.num_blocks(x.size, k)
    e, f = np.empty(nb, np.int8), np.empty(nb, bool)
    _engine.block_exponents(x, k, e, f)
    return e, f


def c_quantize(x: np.ndarray, k: int, exp_global: np.ndarray, world: int) -> np.ndarray:
    out = np.empty(exp_global.size * k, np.int32)
    _engine.quantize(x, k, exp_global, world, out)
    return out.reshape(-1, k)


def c_dequantize(sums, exp_global, nonfinite, world, n) -> np.ndarray:
    out = np.empty(n, np.float32)
    _engine.dequantize(np.ascontiguousarray(sums).reshape(-1), exp_global, nonfinite, world, out)
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def random_floats(rng, n: int, kind: int) -> np.ndarray:
    if kind == 0:  # every bit pattern: NaNs, infinities, denormals, zeros
        return rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    if kind == 1:  # one magnitude per call, anywhere in float32's range
        return (rng.standard_normal(n) * 10.0 ** rng.integers(-44, 38)).astype(np.float32)
    if kind == 2:  # sparse: mostly zero blocks
        x = np.zeros(n, np.float32)
        idx = rng.integers(0, n, max(1, n // 300))
        x[idx] = rng.standard_normal(idx.size).astype(np.float32)
        return x
    x = rng.standard_normal(n).astype(np.float32)  # normal data with a few non-finite
    x[rng.integers(0, n, 3)] = [np.nan, np.inf, -np.inf]
    return x


def c_quantize16(x: np.ndarray, k: int, exp_global: np.ndarray) -> np.ndarray:
    out = np.empty(exp_global.size * k, np.int16)
    _engine.quantize16(x, k, exp_global, out)
    return out.reshape(-1, k)


def c_dequantize16(results, exp_global, nonfinite, world, n) -> np.ndarray:
    out = np.empty(n, np.float32)
    _engine.dequantize16(np.ascontiguousarray(results).reshape(-1), exp_global, nonfinite,
                         world, out)
    return out
