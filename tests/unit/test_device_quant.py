"""The switch's quantization in torch ops (switchml_xdp/torch/device_quant.py):
bit for bit quant.py's, on the CPU here and on a GPU where there is one."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from switchml_xdp import quant  # noqa: E402 - after the importorskip
from switchml_xdp.torch import device_quant as dq  # noqa: E402 - after the importorskip

# The inputs include signalling NaNs: numpy's float32 -> float64 cast in
# quant.py (the reference) warns about them, as it should; not our concern here.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
NO_GPU = "no CUDA device here (CI never has one): the GPU half of these tests needs a GPU machine"


def _inputs(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()                 # every exponent, NaN/Inf, denormals
    x[: n // 2] = (rng.standard_normal(n // 2) * 2.0 ** rng.integers(-30, 30, n // 2)).astype(np.float32)
    x[::97] = 0.0
    x[5::131] = -0.0
    return x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world", [1, 2, 3, 64])
def test_every_step_is_quant_py_bit_for_bit(device, world):
    k = 256
    xs = [_inputs(10 * world + r, 3000) for r in range(world)]
    exp_ref, nf_ref = quant.global_exponents(xs, k)
    exps = [dq.block_exponents(torch.from_numpy(x).to(device), k) for x in xs]
    for x, (e, f) in zip(xs, exps):
        e_ref, f_ref = quant.block_exponents(x, k)
        assert np.array_equal(e.cpu().numpy(), e_ref.astype(np.int32))
        assert np.array_equal(f.cpu().numpy(), f_ref)
    exp_g = torch.from_numpy(exp_ref.astype(np.int32)).to(device)
    qs = [dq.quantize(torch.from_numpy(x).to(device), k, exp_g, world) for x in xs]
    for x, q in zip(xs, qs):
        assert np.array_equal(q.cpu().numpy(), quant.quantize(x, k, exp_ref, world))
    sums = quant.switch_sum([q.cpu().numpy() for q in qs])
    y = dq.dequantize(torch.from_numpy(sums).to(device), exp_g,
                      torch.from_numpy(nf_ref).to(device), world, 3000)
    ref = quant.dequantize(sums, exp_ref, nf_ref, world, 3000)
    assert np.array_equal(y.cpu().numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("device", DEVICES)
def test_allreduce_quantized_is_simulate_allreduce(device):
    """Both rounds through a stand-in for the switch (exact int32 MAX and SUM
    over the ranks' tensors, as the switch computes them)."""
    k, world, n = 64, 3, 1000
    xs = [_inputs(r, n) for r in range(world)]
    xs[1][10] = np.inf
    # The ranks run as threads in lock step: each allreduce returns once every
    # rank has made it, with the MAX or the wrapping int32 SUM of all of them.
    import threading

    barrier = threading.Barrier(world)
    calls: dict = {}
    lock = threading.Lock()

    def allreduce(t, op, rank):
        with lock:
            calls.setdefault(op, []).append((rank, t))
        barrier.wait()
        with lock:
            parts = [u for _, u in sorted(calls[op], key=lambda p: p[0])]
            total = (np.maximum.reduce if op == "max" else
                     lambda a: np.sum(np.stack(a).astype(np.int64), axis=0).astype(np.int32))(
                [p.numpy() for p in parts])
        barrier.wait()
        t.copy_(torch.from_numpy(np.asarray(total, dtype=np.int32)))
        barrier.wait()
        if rank == 0:
            calls.pop(op)
        barrier.wait()

    out = [None] * world

    def rank_body(r):
        out[r] = dq.allreduce_quantized(torch.from_numpy(xs[r]).to(device), k, world,
                                        lambda t, op: allreduce(t, op, r))

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ref = quant.simulate_allreduce(xs, k)
    for y in out:
        assert np.array_equal(y.cpu().numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)
def test_a_cuda_tensor_stays_on_its_device():
    x = torch.randn(5000, device="cuda")
    e, f = dq.block_exponents(x, 256)
    assert e.device.type == "cuda" and f.device.type == "cuda"
