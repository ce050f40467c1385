"""The switch's float32 block quantization in torch ops, on the tensor's device.

For tensors that live on a GPU (docs/pytorch.md, "GPU"): quantizing there means only
int32 payloads cross to the host, and the float work stays where the data is.
These are the formulas of switchml_xdp/quant.py (docs/quantization.md), op for
op, so the result is bit-identical to the streamed path (the C engine and the
udp backend): tests/unit/test_device_quant.py checks it against quant.py on the CPU,
and on a GPU where there is one.

    E_local = floor(log2(max |x|)) over the block's finite elements (frexp
              exponent - 1), clamped to [-128, 127]; -128 for no nonzero element
    E       = max over ranks of E_local            (an int32 MAX allreduce)
    F       = 29 - L - E,  L = ceil(log2(world))
    q       = int32(round_half_even(float64(x) * 2**F)); non-finite and padding -> 0
    S       = the switch's int32 sum of q           (an int32 SUM allreduce)
    y       = float32(float64(S) * 2**-F); a block with a non-finite input -> NaN

Powers of two are built from their IEEE bits, not with exp2/pow, whose
accuracy a GPU library does not promise; F stays within [-114, 157], so every
product is exact in float64 and the two roundings are rint's and the final
cast's, as in quant.py.

`allreduce_quantized` runs the two rounds through any exact int32 allreduce
(the switch's, through a Worker or the process group): the exponents' MAX
round carries one int32 a block (1/k of the data), then the payload's SUM.
The streamed path agrees the exponents one window ahead inside the same
stream instead; the results are the same bits.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import quant


def _blocks(x: torch.Tensor, k: int) -> torch.Tensor:
    flat = x.reshape(-1).to(torch.float32)
    nb = quant.num_blocks(flat.numel(), k)
    if nb * k != flat.numel():
        flat = torch.cat([flat, flat.new_zeros(nb * k - flat.numel())])
    return flat.view(nb, k)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float64, exactly, for integer exponents in float64's
    normal range: the IEEE bit pattern (exponent + 1023) << 52."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def block_exponents(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(E_local int32 [nblocks], nonfinite bool [nblocks]) of one rank's tensor."""
    b = _blocks(x, k)
    finite = torch.isfinite(b)
    peak = torch.where(finite, b.abs(), torch.zeros((), dtype=b.dtype, device=b.device)).amax(dim=1)
    _, e = torch.frexp(peak)                        # exact, also for denormals
    exp = torch.where(peak > 0, e.to(torch.int32) - 1,
                      torch.full_like(e, quant.EXP_MIN, dtype=torch.int32))
    return exp.clamp(quant.EXP_MIN, quant.EXP_MAX), ~finite.all(dim=1)


def _shifts(exp_global: torch.Tensor, world: int) -> torch.Tensor:
    return (quant._TOP_BIT - quant.exponent_bits(world)) - exp_global.to(torch.int64)


def quantize(x: torch.Tensor, k: int, exp_global: torch.Tensor, world: int) -> torch.Tensor:
    """int32 [nblocks, k] payloads with the agreed exponents."""
    b = _blocks(x, k).to(torch.float64)
    b = torch.where(torch.isfinite(b), b, torch.zeros((), dtype=b.dtype, device=b.device))
    q = torch.round(b * _pow2(_shifts(exp_global, world))[:, None])   # half to even
    limit = float(1 << (30 - quant.exponent_bits(world)))
    if q.numel() and bool(q.abs().amax() > limit):
        raise ValueError("exp_global is smaller than a block's local exponent: "
                         "values would not fit the int32 headroom")
    return q.to(torch.int32)


def dequantize(sums: torch.Tensor, exp_global: torch.Tensor, nonfinite_any: torch.Tensor,
               world: int, n: int) -> torch.Tensor:
    """The float32 result (n elements) from the switch's int32 sums."""
    wide = sums.to(torch.float64) * _pow2(-_shifts(exp_global, world))[:, None]
    y = wide.to(torch.float32)
    y[nonfinite_any.to(torch.bool)] = float("nan")
    return y.reshape(-1)[:n]


def allreduce_quantized(x: torch.Tensor, k: int, world: int,
                        int32_allreduce: Callable[[torch.Tensor, str], None]) -> torch.Tensor:
    """The float32 SUM of x over the ranks, quantized on x's device.

    int32_allreduce(t, op) reduces a contiguous 1-D int32 CPU tensor in place
    with op "max" or "sum", exactly, on every rank alike. Only the exponents
    (with the non-finite flags folded in) and the int32 payloads are copied
    to the host; everything float stays on x's device."""
    exp, nonfinite = block_exponents(x, k)
    # The exponents and the flags in one MAX round, two int32 words a block
    # (packed into one word, the flag would dominate the exponent's MAX).
    agreed = torch.stack([exp, nonfinite.to(torch.int32)], dim=1).reshape(-1).cpu()
    int32_allreduce(agreed, "max")
    agreed = agreed.view(-1, 2).to(x.device)
    exp_global, nonfinite_any = agreed[:, 0], agreed[:, 1].to(torch.bool)
    q = quantize(x, k, exp_global, world)
    host = q.reshape(-1).cpu()          # the only bulk copy to the host: int32 payloads
    int32_allreduce(host, "sum")
    return dequantize(host.view_as(q).to(x.device), exp_global, nonfinite_any, world,
                      x.numel()).view_as(x)
