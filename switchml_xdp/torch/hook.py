"""A DDP communication hook that reduces gradient buckets through the switch.

    from switchml_xdp import Worker
    from switchml_xdp.torch import register_hook

    worker = Worker("10.0.0.1", "job1", rank, world)
    model = DistributedDataParallel(net)          # any process group (gloo) for setup
    register_hook(model, worker)                  # gradients now go through the switch

Each bucket's flat buffer is handed to `Worker.allreduce_async` as a numpy
view (no copy); the torch future DDP waits on is completed from the worker's
own thread when the switch has returned the sum, after dividing by the world
size (the gradient average, as the built-in `allreduce_hook` computes it).
DDP launches buckets in the same order on every rank, which is what the
Worker needs (every rank issues the same calls in the same order).

float16 and bfloat16 buckets (a model in that dtype) are widened to float32
(exactly), reduced and divided as float32, and rounded back once.

precision="16" (`register_hook(model, worker, precision="16")`) streams every
bucket in the switch's 16-bit block format (docs/quantization.md, bound B16):
half the bytes on every link, the switch's own replacement for torch's
fp16_compress_wrapper/bf16_compress_wrapper (which still compose with this
hook: they hand it a float16/bfloat16 bucket). Both datapaths stream it; the
hook refuses it up front on a Worker whose datapath does not.

CUDA buckets are staged through pinned host memory in chunks (staging.py),
on the state's own thread, in the order DDP hands them over: quantized on
the GPU (precision "32": the exponents' and the int32 payload's rounds go
through the Worker), or, at precision "16", the float32 values staged as
they are in whole blocks for the Worker's 16-bit format. The future is
CUDA-aware (torch.futures.Future(devices=[...])) and completed from the
pipeline's side stream, which first waited for the stream DDP called the
hook on: DDP's fut.wait() then orders its next kernels after the result,
as with NCCL's futures. HookState(staging=StagingConfig(...)) sets the
chunks (the same on every rank).

Buckets the switch cannot carry (other dtypes, or on a device without
streams here) go through the fallback process group (the default group
unless given) with the built-in hook's arithmetic, with a one-time warning.
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations
# against dist.GradBucket and torch.futures.Future as objects, not strings.
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from ..client.api import Worker
from ..client.calls import check_precision
from .fallbacks import Fallbacks
from .staging import Pipeline, StagingConfig, ops_for

# Bucket dtypes the switch reduces, each as float32 (float16/bfloat16 widen exactly).
_SWITCH_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class HookState:
    """What `allreduce_hook` needs: the Worker, and where unsupported buckets go.

    process_group: the group for fallback buckets (None: the default group).
    precision: "32" (default) or "16", the switch's 16-bit block format for
    every bucket (half the bytes; bound B16 in docs/quantization.md).
    staging: how CUDA buckets go through host memory (staging.py).
    stage_cpu_tensors: CPU buckets through the staging pipeline too (tests:
    the CUDA buckets' path, driven where there is no GPU).
    """
    worker: Worker
    process_group: dist.ProcessGroup | None = None
    precision: str = "32"
    staging: StagingConfig | None = None
    stage_cpu_tensors: bool = False
    buckets: int = 0                    # buckets reduced through the switch
    _fallbacks: Fallbacks = field(default_factory=Fallbacks, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _pipelines: dict = field(default_factory=dict, repr=False)   # device -> Pipeline
    _stager: ThreadPoolExecutor | None = field(default=None, repr=False)
    _route: str | None = field(default=None, repr=False)        # "direct" or "staged"

    @property
    def fallback_buckets(self) -> int:
        """Buckets that went to process_group instead of the switch."""
        return self._fallbacks.count

    def pipeline_for(self, device: torch.device) -> Pipeline:
        with self._lock:
            if device not in self._pipelines:
                self._pipelines[device] = Pipeline(ops_for(device), self.staging)
            if self._stager is None:
                # one thread: staged buckets reach the Worker in DDP's order
                self._stager = ThreadPoolExecutor(max_workers=1, thread_name_prefix="swml-hook")
            return self._pipelines[device]

    def take_route(self, route: str) -> None:
        """Buckets reach the Worker straight from DDP's thread ("direct") or
        through the staging thread ("staged"): one state must not mix them, or
        the calls' order could differ between ranks."""
        with self._lock:
            if self._route is None:
                self._route = route
            elif self._route != route:
                raise ValueError("this HookState has reduced CPU and CUDA buckets: use one "
                                 "HookState (and Worker) per model, on one device")

    def __post_init__(self):
        # At registration, not in the first backward pass: buckets are float32 sums.
        check_precision(self.precision, np.float32, "sum")
        if self.precision not in self.worker.precisions:
            raise ValueError(f"the hook's precision {self.precision!r} is not streamed by this "
                             f"Worker's {self.worker.backend_name} datapath (it does "
                             f"{', '.join(self.worker.precisions)}); use backend='udp' or "
                             "precision='32'")


def _state(state) -> HookState:
    if isinstance(state, HookState):
        return state
    if isinstance(state, Worker):
        return HookState(state)
    raise TypeError(f"the swml hook's state must be a HookState or a Worker, not {type(state).__name__}")


def _fallback(st: HookState, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    st._fallbacks.note((tensor.dtype, tensor.device.type),
                       f"switchml_xdp: DDP bucket of {tensor.dtype} on {tensor.device.type} cannot go "
                       "through the switch (float32, float16, bfloat16 on CPU or CUDA); such buckets "
                       "use the process group's allreduce instead (warned once)", stacklevel=3)
    group = st.process_group
    tensor.div_(dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def allreduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average the bucket over all ranks through the switch.

    state: a HookState (or a bare Worker). Register it with
    `ddp_model.register_comm_hook(state, allreduce_hook)` or `register_hook`.
    """
    st = _state(state)
    tensor = bucket.buffer()
    if tensor.dtype not in _SWITCH_DTYPES or ops_for(tensor.device) is None:
        return _fallback(st, tensor)
    if tensor.device.type != "cpu" or st.stage_cpu_tensors:
        st.take_route("staged")
        return _through_staging(st, tensor)
    st.take_route("direct")
    world = st.worker.info.world
    # DDP's buckets are flat and contiguous: float32 ones are reduced in place.
    in_place = tensor.dtype == torch.float32 and tensor.is_contiguous()
    flat = tensor.view(-1) if in_place else tensor.detach().reshape(-1).to(torch.float32)
    fut: torch.futures.Future = torch.futures.Future()
    with st._lock:
        st.buckets += 1

    def done(cf) -> None:  # runs on the worker's thread (or here, if already done)
        try:
            cf.result()
            flat.div_(world)      # in float32: one rounding to float16/bfloat16 after
            if not in_place:
                tensor.copy_(flat.view_as(tensor))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(e)
            return
        fut.set_result(tensor)

    st.worker.allreduce_async(flat.detach().numpy(), precision=st.precision).add_done_callback(done)
    return fut


def _through_staging(st: HookState, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A bucket on a GPU: staged through host memory on the state's thread."""
    pipeline = st.pipeline_for(tensor.device)
    ticket = pipeline.accept([tensor])          # DDP's stream, as it is now
    fut = pipeline.ops.future()
    worker = st.worker
    world, k, precision = worker.info.world, worker.info.k, st.precision
    with st._lock:
        st.buckets += 1

    def through_worker(host: torch.Tensor, op: str) -> None:
        worker.allreduce(host.numpy(), op, precision=precision if op == "sum" and
                         host.dtype == torch.float32 else "32")

    def run() -> None:
        try:
            with pipeline.on_stream(ticket):
                if precision == "16":
                    # The Worker quantizes to its 16-bit format on the host:
                    # the float32 values go as they are, whole blocks per chunk.
                    flat = tensor.detach().reshape(-1).to(torch.float32)
                    pipeline.reduce(flat, "sum", through_worker, align=k)
                else:
                    flat = pipeline.sum_quantized(tensor.detach(), k, world, through_worker)
                flat.div_(world)      # in float32: one rounding to float16/bfloat16 after
                tensor.copy_(flat.view_as(tensor))
                fut.set_result(tensor)   # on the side stream: the future's events cover it
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            if not fut.done():
                fut.set_exception(e)

    st._stager.submit(run)
    return fut


def register_hook(model: torch.nn.parallel.DistributedDataParallel, worker: Worker,
                  process_group: dist.ProcessGroup | None = None,
                  precision: str = "32", staging: StagingConfig | None = None) -> HookState:
    """Send `model`'s gradient buckets through `worker`; returns the hook's state
    (it counts buckets, see HookState). precision="16": the switch's 16-bit
    block format (HookState). staging: CUDA buckets' chunks (staging.py)."""
    state = HookState(worker, process_group, precision, staging)
    model.register_comm_hook(state, allreduce_hook)
    return state
