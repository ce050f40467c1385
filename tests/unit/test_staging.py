"""GPU tensors' path through the switch (switchml_xdp/torch/staging.py), on
the CPU in CI and on a GPU where there is one.

In-process (fast): the pipeline's chunking, buffer ring and event ordering
driven through `CpuOps` and through `DeferredCopies` (tests/staging_helpers.py:
copies run only when an event says they must have run), with ranks as
threads on an exact stand-in switch; every result is compared bit for bit
with quant.simulate_allreduce (the C engine's and the udp backend's
quantization). Chunk sizes that do not divide the tensor, 1-element and
empty tensors, float16/bfloat16 inputs. The DDP hook's staged route with a
stand-in Worker, at precision "32" and "16".

The same road through the real switch: tests/lab/test_staging_lab.py.

The CUDA tests skip with "no CUDA device" where torch sees none (CI never
has one).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from staging_helpers import DeferredCopies, LockstepSwitch, random_floats, run_ranks  # noqa: E402 - after the importorskip
from switchml_xdp import quant, quant16  # noqa: E402 - after the importorskip
from switchml_xdp.torch.staging import CpuOps, CudaOps, Pipeline, StagingConfig, ops_for  # noqa: E402 - after the importorskip
from two_level import PARAM_ATOL, STEPS  # noqa: E402 - after the importorskip
from two_level import model as _cpu_model  # noqa: E402 - after the importorskip

NO_CUDA = "no CUDA device: torch.cuda.is_available() is false here (CI never has a GPU)"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
K = 64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _ops(kind: str):
    return {"cpu": CpuOps, "deferred": DeferredCopies, "cuda": lambda: CudaOps("cuda")}[kind]()


def _device(kind: str) -> str:
    return "cuda" if kind == "cuda" else "cpu"


def _quantized_sums(kind, world, xs, dtype, config, k=K):
    """Each rank's Pipeline.sum_quantized of its xs[r] (as `dtype`), ranks as threads."""
    switch = LockstepSwitch(world, k)

    def rank(r):
        ops = _ops(kind)
        pipeline = Pipeline(ops, config)
        x = torch.from_numpy(xs[r]).to(dtype).to(_device(kind))
        ticket = pipeline.accept([x])
        with pipeline.on_stream(ticket):
            y = pipeline.sum_quantized(x, k, world, switch.endpoint(r))
            done = ops.record(ops.current_stream())
        ops.synchronize(done)
        if isinstance(ops, DeferredCopies):
            assert ops.pending() == {}, ops.pending()
        return y.cpu(), pipeline.chunks

    return run_ranks(world, rank), switch


def _reference(xs, dtype, k=K):
    """simulate_allreduce of what the ranks hand over (float16/bfloat16
    widen to float32 exactly, as the pipeline and the Worker do)."""
    widened = [torch.from_numpy(x).to(dtype).float().numpy() for x in xs]
    return quant.simulate_allreduce(widened, k)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _same_bits_any_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, except a NaN's payload: CUDA's arithmetic writes its own
    NaN (0x7fffffff) where the CPU's keeps the one it was given (0x7fc00000)."""
    nan = torch.isnan(a)
    return torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(torch.int32),
                                                            b[~nan].view(torch.int32))


def _floats(seed: int, n: int, dtype: torch.dtype) -> np.ndarray:
    """random_floats in the dtype's range, so float16's blocks are not all NaN."""
    return random_floats(seed, n, span=10 if dtype == torch.float16 else 20)


# ------------------------------------------------------------ the pipeline

@pytest.mark.parametrize("kind", ["cpu", "deferred"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,chunk,buffers", [(1, 7, 2), (255, 7, 2), (3001, 100, 3), (3001, 1 << 20, 3),
                                             (1000, 64, 1), (257, 1, 2)])
@pytest.mark.parametrize("world", [1, 3])
def test_sum_quantized_is_simulate_allreduce_bit_for_bit(kind, dtype, n, chunk, buffers, world):
    xs = [_floats(10 * world + r, n, dtype) for r in range(world)]
    if n > 10:
        xs[-1][10] = np.inf                       # that block: NaN on every rank
    outs, _ = _quantized_sums(kind, world, xs, dtype, StagingConfig(chunk, buffers))
    ref = _reference(xs, dtype)
    for y, chunks in outs:
        assert y.dtype == torch.float32
        assert _same_bits(y.numpy(), ref)
        payload = quant.num_blocks(n, K) * K
        assert chunks == -(-payload // chunk) + -(-2 * quant.num_blocks(n, K) // chunk)


@pytest.mark.parametrize("kind", ["cpu", "deferred"])
def test_an_empty_tensor_still_makes_its_calls(kind):
    """Empty: one empty call a round, as the Worker makes for an empty tensor
    (a rank whose tensor is not empty then gets CallMismatch, not a stall)."""
    outs, switch = _quantized_sums(kind, 2, [np.zeros(0, np.float32)] * 2, torch.float32,
                                   StagingConfig(7, 2))
    for y, chunks in outs:
        assert y.shape == (0,) and chunks == 2
    assert switch.ops_seen == [("max", "torch.int32", 0), ("sum", "torch.int32", 0)]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("n,chunk,buffers", [(0, 5, 2), (1, 5, 2), (999, 10, 1), (999, 10, 2),
                                             (999, 13, 3), (999, 5000, 3)])
def test_reduce_in_place_in_chunks_is_exact(op, n, chunk, buffers):
    """int32 SUM (wrapping, as the switch adds), MIN and MAX, staged as they
    are: the values of every rank, exactly."""
    world = 3
    gen = torch.Generator().manual_seed(n + chunk)
    xs = [torch.randint(-2**31, 2**31 - 1, (n,), generator=gen, dtype=torch.int32) for _ in range(world)]
    switch = LockstepSwitch(world)

    def rank(r):
        ops = DeferredCopies()
        pipeline = Pipeline(ops, StagingConfig(chunk, buffers))
        flat = xs[r].clone()
        with pipeline.on_stream(pipeline.accept([flat])):
            pipeline.reduce(flat, op, switch.endpoint(r))
        assert ops.pending() == {}
        return flat, pipeline.chunks

    stacked = torch.stack(xs).to(torch.int64)
    want = {"sum": ((stacked.sum(0) + 2**31) % 2**32 - 2**31).to(torch.int32),
            "max": stacked.amax(0).to(torch.int32), "min": stacked.amin(0).to(torch.int32)}[op]
    for flat, chunks in run_ranks(world, rank):
        assert torch.equal(flat, want)
        assert chunks == max(1, -(-n // chunk))


def test_the_callers_stream_is_waited_for():
    """The input is written by a copy still queued on the caller's stream
    when the call is made: the pipeline's stream must wait for it."""
    ops = DeferredCopies()
    pipeline = Pipeline(ops, StagingConfig(100, 2))
    x_true = torch.from_numpy(random_floats(1, 1000))
    x = torch.zeros(1000)
    ops.copy(x, x_true, ops.current_stream())     # still pending on the caller's stream
    ticket = pipeline.accept([x])
    with pipeline.on_stream(ticket):
        y = pipeline.sum_quantized(x, K, 1, lambda t, op: None)   # one rank: the sum is itself
    assert _same_bits(y.numpy(), quant.simulate_allreduce([x_true.numpy()], K))


def test_the_deferred_copies_catch_a_missing_wait():
    """The stand-in has teeth: with the device-side waits dropped, chunks
    come back from buffers already refilled, and the result is wrong."""
    ops = DeferredCopies()
    ops.wait = lambda stream, event: None
    pipeline = Pipeline(ops, StagingConfig(10, 1))
    flat = torch.arange(100, dtype=torch.int32)
    with pipeline.on_stream(pipeline.accept([flat])):
        pipeline.reduce(flat, "sum", lambda t, op: t.mul_(2))
    ops._run_until(ops.record(pipeline.back))
    assert not torch.equal(flat, torch.arange(100, dtype=torch.int32) * 2)


def test_host_buffers_are_bounded_and_reused():
    pipeline = Pipeline(CpuOps(), StagingConfig(chunk_elements=64, buffers=2))
    seen = []

    def keep(t, op):
        seen.append(t.data_ptr())

    for n in (1000, 500, 64 * 7 + 3):
        with pipeline.on_stream(pipeline.accept([])):
            pipeline.reduce(torch.zeros(n, dtype=torch.int32), "sum", keep)
    assert len(pipeline._ring) == 2
    assert set(seen) == {b.data_ptr() for b in pipeline._ring}


def test_a_chunk_is_whole_blocks_when_aligned():
    calls = []
    pipeline = Pipeline(CpuOps(), StagingConfig(chunk_elements=100, buffers=2))
    with pipeline.on_stream(pipeline.accept([])):
        pipeline.reduce(torch.zeros(1000), "sum", lambda t, op: calls.append(t.numel()), align=K)
    assert calls == [64] * 15 + [40]
    assert sum(calls) == 1000


def test_staging_config_refuses_nonsense():
    with pytest.raises(ValueError, match="chunk_elements >= 1"):
        StagingConfig(chunk_elements=0)
    with pytest.raises(ValueError, match="buffers >= 1"):
        StagingConfig(buffers=0)


def test_ops_for_devices():
    assert isinstance(ops_for(torch.device("cpu")), CpuOps)
    assert ops_for(torch.device("meta")) is None
    if not torch.cuda.is_available():
        assert ops_for(torch.device("cuda", 0)) is None


def test_the_gpu_benchmark_runs_and_says_where(capsys):
    from switchml_xdp.bench import gpu_staging

    assert gpu_staging.main(["--sizes", "1K,3000", "--chunk", "700", "--iters", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu"] == torch.cuda.is_available()
    assert [r["elements"] for r in out["rows"]] == [1024, 3000]
    if not out["gpu"]:
        assert "NOT a GPU run" in out["device"]


# ------------------------------------------------------------ the DDP hook's staged route

class _Info:
    def __init__(self, world):
        self.world, self.k, self.name = world, K, "fake"


class FakeWorker:
    """What the hook uses of a Worker, on a LockstepSwitch."""
    backend_name = "fake"
    precisions = ("32", "16")

    def __init__(self, switch: LockstepSwitch, rank: int):
        self.info = _Info(switch.world)
        self._switch, self._rank = switch, rank
        self.calls: list[tuple[str, str, int]] = []

    def allreduce(self, array: np.ndarray, op: str = "sum", precision: str = "32") -> np.ndarray:
        self.calls.append((op, precision, array.size))
        self._switch.endpoint(self._rank, precision)(torch.from_numpy(array), op)
        return array


class _Bucket:
    def __init__(self, t):
        self._t = t

    def buffer(self):
        return self._t


def _hook_averages(device, dtype, precision, world=2, n=1000):
    from switchml_xdp.torch import HookState, allreduce_hook

    xs = [_floats(40 + r, n, dtype) for r in range(world)]
    xs[-1][300] = np.inf                          # its block: NaN on every rank
    switch = LockstepSwitch(world, K)

    def rank(r):
        state = HookState(FakeWorker(switch, r), precision=precision,
                          staging=StagingConfig(chunk_elements=100, buffers=2),
                          stage_cpu_tensors=True)
        bucket = torch.from_numpy(xs[r]).to(dtype).to(device)
        got = allreduce_hook(state, _Bucket(bucket)).wait()
        assert got is bucket and state.buckets == 1 and state.fallback_buckets == 0
        return got.float().cpu(), state.worker.calls

    widened = [torch.from_numpy(x).to(dtype).float().numpy() for x in xs]
    total = (quant16.simulate_allreduce16(widened, K) if precision == "16"
             else quant.simulate_allreduce(widened, K))
    want = (torch.from_numpy(total) / world).to(dtype).float()
    return run_ranks(world, rank), want


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("precision", ["32", "16"])
def test_hook_staged_bucket_is_the_cpu_paths_average(dtype, precision):
    """The bucket's average, bit for bit what the CPU path computes (the
    switch's sum, divided in float32, rounded once to the bucket's dtype).
    At precision 16 every chunk is whole blocks (the Worker quantizes)."""
    outs, want = _hook_averages("cpu", dtype, precision)
    for got, calls in outs:
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))
        if precision == "16":
            assert [c[:2] for c in calls] == [("sum", "16")] * len(calls)
            assert all(c[2] % K == 0 for c in calls[:-1])
        else:
            assert {c[:2] for c in calls} == {("max", "32"), ("sum", "32")}


def test_hook_state_refuses_to_mix_routes():
    from switchml_xdp.torch import HookState, allreduce_hook

    switch = LockstepSwitch(1, K)
    state = HookState(FakeWorker(switch, 0), stage_cpu_tensors=True)
    allreduce_hook(state, _Bucket(torch.ones(10))).wait()
    state.stage_cpu_tensors = False
    with pytest.raises(ValueError, match="one HookState"):
        allreduce_hook(state, _Bucket(torch.ones(10)))


def test_a_failing_chunk_reaches_the_future_and_the_pipeline_goes_on():
    from switchml_xdp.torch import HookState, allreduce_hook

    class Failing(FakeWorker):
        def allreduce(self, array, op="sum", precision="32"):
            if len(self.calls) == 2:          # the payload's second chunk
                self.calls.append((op, precision, array.size))
                raise RuntimeError("CallMismatch stand-in")
            return super().allreduce(array, op, precision)

    state = HookState(Failing(LockstepSwitch(1, K), 0), stage_cpu_tensors=True,
                      staging=StagingConfig(chunk_elements=100, buffers=2))
    with pytest.raises(RuntimeError, match="CallMismatch stand-in"):
        allreduce_hook(state, _Bucket(torch.ones(1000))).wait()
    x = torch.from_numpy(random_floats(9, 1000))
    got = allreduce_hook(state, _Bucket(x.clone())).wait()
    assert _same_bits(got.numpy(), quant.simulate_allreduce([x.numpy()], K))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
def test_ddp_with_the_staged_hook_matches_plain_ddp(device):
    """In this process, world 1 (Gloo sets DDP up): a model on `device`
    trained a few steps with the hook's staged route equals plain DDP on
    the CPU within the quantization's tolerance. On a GPU: a CUDA model, DDP's
    own streams and its wait on the hook's CUDA-aware future."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from switchml_xdp.torch import register_hook

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        params = {}
        for mode in ("plain", "hook"):
            model = _cpu_model().to(device if mode == "hook" else "cpu")
            ddp = DDP(model, bucket_cap_mb=0.001)
            if mode == "hook":
                state = register_hook(ddp, FakeWorker(LockstepSwitch(1, K), 0),
                                      staging=StagingConfig(chunk_elements=300, buffers=2))
                state.stage_cpu_tensors = True
            opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
            for step in range(STEPS):
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)
                opt.zero_grad()
                on = next(model.parameters()).device
                torch.nn.functional.cross_entropy(ddp(x.to(on)), y.to(on)).backward()
                opt.step()
            params[mode] = torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])
        assert state.buckets >= STEPS and state.fallback_buckets == 0
        moved = (params["plain"] - torch.cat([p.detach().reshape(-1) for p in _cpu_model().parameters()]))
        assert moved.abs().max() > 1e-2
        assert (params["hook"] - params["plain"]).abs().max() <= PARAM_ATOL
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------ on a GPU

@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n,chunk", [(1, 7), (3001, 100), (1 << 16, 1 << 12)])
def test_cuda_sum_quantized_is_simulate_allreduce_bit_for_bit(dtype, n, chunk):
    xs = [_floats(70 + r, n, dtype) for r in range(3)]
    outs, _ = _quantized_sums("cuda", 3, xs, dtype, StagingConfig(chunk, 2))
    for y, _ in outs:
        assert _same_bits(y.numpy(), _reference(xs, dtype))


@needs_cuda
def test_cuda_waits_for_the_callers_stream_and_hands_back_through_the_future():
    """The input is computed on a caller's stream that is still busy (a long
    sleep kernel first); the result is read on that stream after fut.wait()."""
    from switchml_xdp.torch import HookState, allreduce_hook

    switch = LockstepSwitch(1, K)
    state = HookState(FakeWorker(switch, 0), staging=StagingConfig(chunk_elements=1000))
    x = torch.from_numpy(random_floats(5, 50_000))
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        bucket = torch.zeros(50_000, device="cuda")
        torch.cuda._sleep(200_000_000)            # ~0.1 s of a busy stream
        bucket.copy_(x.to("cuda", non_blocking=True))
        fut = allreduce_hook(state, _Bucket(bucket))
        fut.wait()                                # the caller's stream waits for the result
        doubled = bucket * 2                      # enqueued on the caller's stream, after it
    torch.cuda.synchronize()
    want = torch.from_numpy(quant.simulate_allreduce([x.numpy()], K))
    assert torch.equal(doubled.cpu(), want * 2)


@needs_cuda
def test_cuda_hook_bucket_is_the_cpu_paths_average():
    for dtype in DTYPES:
        for precision in ("32", "16"):
            outs, want = _hook_averages("cuda", dtype, precision)
            for got, _ in outs:
                assert _same_bits_any_nan(got, want), (dtype, precision)
