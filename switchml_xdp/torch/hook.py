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

Buckets the switch cannot carry (not float32, or not on the CPU) go through
the fallback process group (the default group unless given) with the
built-in hook's arithmetic, with a one-time warning.
"""
# No `from __future__ import annotations`: DDP checks the hook's annotations
# against dist.GradBucket and torch.futures.Future as objects, not strings.
import threading
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..worker.api import Worker


@dataclass
class HookState:
    """What `allreduce_hook` needs: the Worker, and where unsupported buckets go.

    process_group: the group for fallback buckets (None: the default group).
    """
    worker: Worker
    process_group: dist.ProcessGroup | None = None
    buckets: int = 0                    # buckets reduced through the switch
    fallback_buckets: int = 0           # buckets that went to process_group
    _warned: set = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


def _state(state) -> HookState:
    if isinstance(state, HookState):
        return state
    if isinstance(state, Worker):
        return HookState(state)
    raise TypeError(f"the swml hook's state must be a HookState or a Worker, not {type(state).__name__}")


def _fallback(st: HookState, tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    kind = (tensor.dtype, tensor.device.type)
    with st._lock:
        st.fallback_buckets += 1
        first = kind not in st._warned
        st._warned.add(kind)
    if first:
        warnings.warn(f"switchml_xdp: DDP bucket of {tensor.dtype} on {tensor.device.type} "
                      "cannot go through the switch (float32 CPU only); such buckets use the "
                      "process group's allreduce instead (warned once)", RuntimeWarning, stacklevel=3)
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
    if tensor.dtype != torch.float32 or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return _fallback(st, tensor)
    world = st.worker.info.world
    fut: torch.futures.Future = torch.futures.Future()
    with st._lock:
        st.buckets += 1

    def done(cf) -> None:  # runs on the worker's thread (or here, if already done)
        try:
            cf.result()
            tensor.div_(world)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            fut.set_exception(e)
            return
        fut.set_result(tensor)

    st.worker.allreduce_async(tensor.detach().numpy()).add_done_callback(done)
    return fut


def register_hook(model: torch.nn.parallel.DistributedDataParallel, worker: Worker,
                  process_group: dist.ProcessGroup | None = None) -> HookState:
    """Send `model`'s gradient buckets through `worker`; returns the hook's state
    (it counts buckets, see HookState)."""
    state = HookState(worker, process_group)
    model.register_comm_hook(state, allreduce_hook)
    return state
