"""`swml`: a torch.distributed backend whose all_reduce, broadcast and barrier go
through the switch.

    import switchml_xdp.torch                       # registers the backend
    from switchml_xdp.torch import SwmlOptions

    dist.init_process_group("swml", rank=r, world_size=n,   # any init_method/store
                            pg_options=SwmlOptions(switch="10.0.0.1"))
    dist.all_reduce(t)                               # float32/int32, CPU or CUDA: the switch

What goes where (docs/pytorch.md has the table):
- `all_reduce` (and `all_reduce_coalesced`) of CPU or CUDA tensors of float32, int32,
  float16 or bfloat16 with SUM, AVG, MIN or MAX go through a
  `switchml_xdp.Worker` joined to the switch. float16/bfloat16 are widened to
  float32 (exactly), reduced as float32, then rounded back once. SUM/AVG of
  floats are quantized as in docs/quantization.md (32-bit mode); int32 sums
  and every MIN/MAX are exact. AVG divides the sum by the world size; an
  integer AVG is refused (ValueError) on every rank, as Gloo refuses it.
- `broadcast` of one CPU or CUDA tensor of any dtype: its bytes, as int32,
  summed with every other rank's zeros (exact), so every rank gets the root's bits.
- CUDA tensors are staged through pinned host memory in chunks (staging.py):
  float SUM/AVG quantized on the GPU (device_quant.py, the same bits as the
  CPU path's formulas) with the exponents and int32 payload streamed; other
  ops' values staged as they are. The Work follows ProcessGroupNCCL's stream
  semantics (_through_switch). SwmlOptions(staging=StagingConfig(...)) sets
  the chunk size and the number of host buffers (the same on every rank).
- `barrier`: one int32 round through the switch (after this group's pending
  Gloo work, as Gloo's own barrier waits for it).
- Everything else that the switch could be asked for (PRODUCT, bitwise ops,
  other dtypes, tensors on other devices, lists of several tensors) falls back to a Gloo
  process group built from the same store, with one warning per kind per
  process group; `fallbacks` counts those calls, `switch_calls` the others.
- The rest (all_gather, reduce_scatter, gather, scatter, all_to_all,
  send/recv) is Gloo's by design, without a warning: the switch only adds.

Configuration: `pg_options=SwmlOptions(...)`, or the environment:
SWML_SWITCH (the switch's address, required one way or the other), SWML_JOB
(the job name; by default rank 0 makes one up and shares it through the
store; the job's token is always made by rank 0 with `secrets` and shared the
same way, so only this process group's ranks can change the job on the switch),
SWML_WORKER_BACKEND (auto, udp or afxdp; default auto), SWML_PORT,
SWML_SHM_BYTES (shared memory per rank of a host, default 4 MiB).
Gloo's device is GLOO_SOCKET_IFNAME's interface if set, else the interface
that routes to the switch.

Several ranks on one host (torchrun --nproc_per_node=R): the ranks that
share a host reduce into their lowest rank through shared memory;
only that leader joins the switch's job (rank = host index, world = number of
hosts) and streams; the result goes back to the host's ranks (hosts.py).
CUDA tensors take the same road from their staged host copies: each rank
quantizes for the whole group's size, and the int32 payloads add up on the
leader's host (exact in any order), so no NCCL is needed.

Switch and Gloo work are separate channels: a switch all_reduce issued with
async_op=True runs on the group's own thread while later Gloo collectives
proceed. Calls through the switch run in the order they are made, the same on
every rank.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import os
import secrets
import sys
import threading
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllreduceCoalescedOptions, AllreduceOptions, ProcessGroupGloo, ReduceOp,
)

from .. import wire
from ..client.api import Worker, local_end
from .hosts import HostLayout, LocalGroup, agree_layout, open_local_group
from .staging import Pipeline, StagingConfig, ops_for

BACKEND_NAME = "swml"
# dtype -> the dtype the Worker reduces it as. float16/bfloat16 widen to float32
# exactly (every value, NaN and inf included), so the result is float32's,
# rounded once on the way back.
_WORK_DTYPE = {torch.float32: torch.float32, torch.int32: torch.int32,
               torch.float16: torch.float32, torch.bfloat16: torch.float32}
# ReduceOp name -> the Worker's op (AVG: a sum, divided by the world size after).
_SWITCH_OPS = {"SUM": "sum", "AVG": "sum", "MIN": "min", "MAX": "max"}
_WHAT_THE_SWITCH_DOES = ("the switch does SUM/AVG/MIN/MAX of float32, int32, float16, bfloat16 "
                         "and broadcast of any dtype, on CPU and CUDA tensors")
_JOB_KEY = "swml/job"
_K_KEY = "swml/k"
_TOKEN_KEY = "swml/token"


@dataclass
class SwmlOptions:
    """Options of the swml backend (pass as init_process_group's pg_options).
    Fields left None are read from the environment (see the module doc)."""
    switch: str | None = None
    job: str | None = None
    backend: str | None = None          # the Worker's datapath: auto, udp, afxdp
    port: int | None = None
    control_port: int = wire.DEFAULT_CONTROL_PORT
    iface: str | None = None            # the Worker's interface (default: route to the switch)
    gloo_iface: str | None = None       # Gloo's interface (default: see the module doc)
    verbose: bool = False               # let the Worker say which datapath it took
    shm_bytes: int | None = None        # shared memory per rank of a host (SWML_SHM_BYTES; 4 MiB)
    staging: StagingConfig | None = None   # GPU tensors' chunks through host memory (staging.py)

    def resolved(self) -> "SwmlOptions":
        env = os.environ
        switch = self.switch or env.get("SWML_SWITCH")
        if not switch:
            raise ValueError("the swml backend needs the switch's address: pass "
                             "pg_options=SwmlOptions(switch=...) or set SWML_SWITCH")
        port = self.port if self.port is not None else int(env.get("SWML_PORT", wire.DEFAULT_PORT))
        return SwmlOptions(switch=switch, job=self.job or env.get("SWML_JOB"),
                           backend=self.backend or env.get("SWML_WORKER_BACKEND", "auto"),
                           port=port, control_port=self.control_port, iface=self.iface,
                           gloo_iface=self.gloo_iface,
                           verbose=self.verbose, shm_bytes=self.shm_bytes,
                           staging=self.staging or StagingConfig())


class _FutureWork(dist.Work):
    """A Work completed through a torch future (set from the group's thread).

    For CUDA tensors the future is CUDA-aware (staging.CudaOps.future): wait()
    and result() return once the host side is done, having made the
    caller's current stream wait for the device side -- ProcessGroupNCCL's
    Work.wait(), which blocks the stream rather than the host."""

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self._fut = fut

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._fut.wait()  # re-raises the switch's error, if any
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001
            return e
        return None

    def result(self) -> list[torch.Tensor]:
        return self._fut.wait()


_OWN_DIRS = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(dist.__file__)))


def _caller_level() -> int:
    """warnings' stacklevel of the first frame outside this package and
    torch.distributed: the user's call, not torch's wrappers."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)).startswith(_OWN_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _op_name(op) -> str:
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        if op == getattr(ReduceOp, name, None):
            return name
    return str(op)


class ProcessGroupSwml(dist.ProcessGroup):
    """The `swml` process group: all_reduce through the switch, the rest through Gloo."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 options: SwmlOptions | None = None, group_id: str = ""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        opts = (options or SwmlOptions()).resolved()
        self.options = opts
        job = opts.job or self._agree_job_name(store, rank, group_id)
        token = self._agree_token(store, rank)
        join_timeout = max(10.0, min(timeout.total_seconds(), 300.0))
        # The address the switch would see: ranks that share it share a host.
        here = local_end(opts.switch, opts.control_port, opts.iface)
        self.layout: HostLayout = agree_layout(store, rank, size, here.ip)
        self.local: LocalGroup | None = None
        self.worker: Worker | None = None
        try:
            if len(self.layout.local_ranks) > 1:
                self.local = open_local_group(store, self.layout, timeout, opts.shm_bytes)
            if self.layout.is_leader:
                self.worker = Worker(opts.switch, job, self.layout.host_index, self.layout.n_hosts,
                                     iface=opts.iface, backend=opts.backend, port=opts.port,
                                     control_port=opts.control_port, join_timeout=join_timeout,
                                     verbose=opts.verbose, token=token)
            # Every rank quantizes its own GPU tensors (staging.py): with the job's block size.
            self.k = self._agree_k(store, rank)
        except BaseException:
            self._close_switch_side()
            raise
        # One thread runs the switch calls in order: local reduce, the
        # leader's stream, the local share.
        self._pipeline = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"swml-pg{rank}")
        try:
            gloo_store = dist.PrefixStore("swml-gloo/", store)
            if opts.gloo_iface or not os.environ.get("GLOO_SOCKET_IFNAME"):
                gloo_opts = ProcessGroupGloo._Options()
                gloo_opts._timeout = timeout
                gloo_opts._devices = [ProcessGroupGloo.create_device(
                    interface=opts.gloo_iface or here.iface)]
                self.gloo = ProcessGroupGloo(gloo_store, rank, size, gloo_opts)
            else:  # this constructor reads GLOO_SOCKET_IFNAME (which may list several)
                self.gloo = ProcessGroupGloo(gloo_store, rank, size, timeout)
        except BaseException:
            self._close_switch_side()
            raise
        self.fallbacks = 0          # all_reduce/broadcast calls that went to Gloo instead
        self.switch_calls = 0       # all_reduce/broadcast/barrier calls through the switch
        self._warned: set = set()
        self._gloo_pending: list = []   # Gloo's Work not yet completed (see barrier)
        self._lock = threading.Lock()
        self._closed = False
        self._staging: dict[torch.device, Pipeline] = {}    # one per device, on first use
        # Tests: CPU tensors through the staging pipeline too (its CpuOps), to
        # drive the GPU tensors' path where CI has no GPU.
        self.stage_cpu_tensors = False
        _live.add(self)

    @staticmethod
    def _agree_job_name(store: dist.Store, rank: int, group_id: str) -> str:
        """Rank 0 makes up a name no other job on the switch has; the others read it."""
        if rank == 0:
            gid = "".join(c for c in str(group_id) if c.isalnum())[:16]
            store.set(_JOB_KEY, f"torch-{gid or 'pg'}-{secrets.token_hex(6)}")
        return store.get(_JOB_KEY).decode()

    def _agree_k(self, store: dist.Store, rank: int) -> int:
        """The job's block size, from rank 0 (a host leader: it has a Worker)."""
        if rank == 0:
            store.set(_K_KEY, str(self.worker.info.k))
        return int(store.get(_K_KEY).decode())

    @staticmethod
    def _agree_token(store: dist.Store, rank: int) -> str:
        """Rank 0 makes the job's token; the others read it from the store
        (which only the process group's members reach)."""
        if rank == 0:
            store.set(_TOKEN_KEY, secrets.token_hex(16))
        return store.get(_TOKEN_KEY).decode()

    # -- identity -------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - the C++ name the trampoline looks up
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        where = (f"job={self.worker.info.name!r}" if self.worker is not None
                 else f"host leader rank {self.layout.local_ranks[0]}")
        return f"ProcessGroupSwml(rank={self._rank}, size={self._size}, {where})"

    # -- checks -----------------------------------------------------------------
    def _tensor_reason(self, collective: str, tensors: list[torch.Tensor]) -> str | None:
        """Why these tensors cannot be handed to the Worker at all (None if they can)."""
        if len(tensors) != 1 and collective != "all_reduce_coalesced":
            return f"{collective} of a list of {len(tensors)} tensors"
        if not tensors:
            return f"{collective} of no tensors"
        if len({t.device for t in tensors}) != 1:
            return f"{collective} of tensors on several devices"
        device = tensors[0].device
        if device.type != "cpu" and ops_for(device) is None:
            # CUDA tensors are staged through host memory (staging.py); a device
            # without streams and events there stays with Gloo.
            return f"{collective} on {device.type} tensors"
        if any(t.layout != torch.strided for t in tensors):
            return f"{collective} on {tensors[0].layout} tensors"
        if any(t.is_quantized for t in tensors):
            return f"{collective} on quantized tensors"
        return None

    def _allreduce_reason(self, collective: str, tensors: list[torch.Tensor], op) -> str | None:
        """Why this all_reduce cannot go through the switch (None if it can); a
        ValueError for what no backend reduces exactly (an integer average)."""
        name = _op_name(op)
        dtypes = {t.dtype for t in tensors}
        if name == "AVG" and any(not (d.is_floating_point or d.is_complex) for d in dtypes):
            # Raised on every rank alike, before anything is sent: nobody waits.
            raise ValueError(
                f"{collective} with ReduceOp.AVG on {', '.join(sorted(map(str, dtypes)))}: an "
                "integer average is not exact (Gloo refuses it too); use SUM and divide as "
                "the application needs")
        reason = self._tensor_reason(collective, tensors)
        if reason:
            return reason
        if len(dtypes) != 1 or next(iter(dtypes)) not in _WORK_DTYPE:
            return f"{collective} on {', '.join(sorted(str(d) for d in dtypes))}"
        if name not in _SWITCH_OPS:
            return f"{collective} {name}"
        if any(t.is_conj() or t.is_neg() for t in tensors):
            return f"{collective} {name} on tensors with a pending conj/neg view"
        return None

    def _fallback(self, reason: str, start):
        """Count and warn (once per kind) for a call that Gloo does instead."""
        with self._lock:
            self.fallbacks += 1
            first = reason not in self._warned
            self._warned.add(reason)
        if first:
            warnings.warn(f"switchml_xdp: {reason} is not done by the switch ({_WHAT_THE_SWITCH_DOES}): "
                          "it falls back to gloo (warned once per kind)", RuntimeWarning,
                          stacklevel=_caller_level())
        return self._gloo(start())

    def _gloo(self, work):
        """Keep Gloo's Work until it completes: barrier() waits for it first."""
        with self._lock:
            self._gloo_pending = [w for w in self._gloo_pending if not w.is_completed()]
            self._gloo_pending.append(work)
        return work

    # -- through the switch -------------------------------------------------------
    def _reduce_among_all(self, flat: torch.Tensor, op: str) -> None:
        """Reduce a contiguous 1-D float32/int32 CPU tensor in place with the
        Worker's `op` over every rank: first among each host's ranks, then
        through the switch among the hosts' leaders, then shared back."""
        if self.local is not None:
            self.local.reduce_to_leader(flat, op.upper())
        error = None
        if self.worker is not None:
            try:
                self.worker.allreduce(flat.detach().numpy(), op)
            except BaseException as e:  # noqa: BLE001 - shared with the host below
                error = e
        if self.local is not None:
            self.local.share(flat, error)
        elif error is not None:
            raise error

    def _staged(self, flat: torch.Tensor) -> bool:
        return flat.device.type != "cpu" or self.stage_cpu_tensors

    def _staging_for(self, device: torch.device) -> Pipeline:
        if device not in self._staging:
            self._staging[device] = Pipeline(ops_for(device), self.options.staging)
        return self._staging[device]

    def _reduce_staged(self, pipeline: Pipeline, flat: torch.Tensor, op: str) -> None:
        """A device tensor through host memory (staging.py). Every rank
        quantizes its own float32 tensor for the whole group's size; the
        int32 rounds go through _reduce_among_all, so several ranks on a host
        add their int32 payloads on the leader's host copy (exact, in any
        order) before it streams. Other ops are exact as they are."""
        if op == "sum" and flat.is_floating_point():
            flat.copy_(pipeline.sum_quantized(flat, self.k, self._size, self._reduce_among_all))
        else:
            pipeline.reduce(flat, op, self._reduce_among_all)

    def _through_switch(self, flat: torch.Tensor, op: str, finish, avg: bool = False,
                        outputs: tuple = ()) -> _FutureWork:
        """Reduce a contiguous 1-D float32/int32 tensor in place with the
        Worker's `op` over every rank; finish() runs after, on the group's
        thread, and returns the future's value (it writes `outputs`).

        A tensor on a GPU follows ProcessGroupNCCL's stream semantics: the
        caller's current stream is marked now, and the group's thread works
        on a side stream that waits for that mark (the caller may have queued
        the kernels that compute the tensor without waiting for them). The
        future is CUDA-aware and completed from the side stream, so Work.wait()
        -- which torch calls for a synchronous all_reduce -- and
        get_future().wait()/then() make the waiter's current stream wait for
        the result, without blocking on the GPU. Unlike NCCL's, wait() does
        block the host until the switch has answered: the host streams."""
        with self._lock:
            self.switch_calls += 1
        staged = self._staged(flat)
        pipeline = self._staging_for(flat.device) if staged else None
        ticket = pipeline.accept([flat, *outputs]) if staged else None
        fut = pipeline.ops.future() if staged else torch.futures.Future()
        size = self._size

        def run() -> None:
            try:
                with pipeline.on_stream(ticket) if staged else contextlib.nullcontext():
                    if staged:
                        self._reduce_staged(pipeline, flat, op)
                    else:
                        self._reduce_among_all(flat, op)
                    if avg:
                        flat.div_(size)   # in float32, before any rounding to float16/bfloat16
                    value = finish()
                    # on the side stream: a CUDA future records its events there
                    fut.set_result(value)
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                if not fut.done():
                    fut.set_exception(e)

        self._pipeline.submit(run)
        return _FutureWork(fut)

    def _reduce(self, tensors: list[torch.Tensor], op) -> _FutureWork:
        """all_reduce of tensors that _allreduce_reason passed: in place when
        one contiguous tensor is already the Worker's dtype, else through one
        flat buffer of it, copied (rounded, for float16/bfloat16) back."""
        name = _op_name(op)
        work_dtype = _WORK_DTYPE[tensors[0].dtype]
        t = tensors[0]
        # detach(): the result is written into the tensors' storage, as Gloo writes
        # it, also into parameters that require grad (autograd refuses copy_ there).
        if len(tensors) == 1 and t.dtype == work_dtype and t.is_contiguous():
            return self._through_switch(t.detach().view(-1), _SWITCH_OPS[name], lambda: tensors,
                                        avg=name == "AVG", outputs=tuple(tensors))
        flat = torch.cat([x.detach().reshape(-1).to(work_dtype) for x in tensors])

        def finish():
            off = 0
            for x in tensors:
                n = x.numel()
                x.detach().copy_(flat[off:off + n].view_as(x))
                off += n
            return tensors

        return self._through_switch(flat, _SWITCH_OPS[name], finish, avg=name == "AVG",
                                    outputs=tuple(tensors))

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            opts = AllreduceOptions()
        elif not isinstance(opts, AllreduceOptions):  # allreduce(tensors, op)
            op, opts = opts, AllreduceOptions()
            opts.reduceOp = op
        reason = self._allreduce_reason("all_reduce", tensors, opts.reduceOp)
        if reason:
            return self._fallback(reason, lambda: self.gloo.allreduce(tensors, opts))
        return self._reduce(tensors, opts.reduceOp)

    def allreduce_coalesced(self, tensors, opts=None):
        if opts is None:
            opts = AllreduceCoalescedOptions()
        reason = self._allreduce_reason("all_reduce_coalesced", tensors, opts.reduceOp)
        if reason:
            return self._fallback(reason, lambda: self.gloo.allreduce_coalesced(tensors, opts))
        return self._reduce(tensors, opts.reduceOp)

    def broadcast(self, tensors, opts):
        """The root's bytes as int32 (zero-padded to a multiple of 4), every
        other rank's zeros: the switch's int32 sum is the root's bits, exactly."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        reason = self._tensor_reason("broadcast", tensors)
        if reason:
            return self._fallback(reason, lambda: self.gloo.broadcast(tensors, opts))
        t = tensors[0]
        nbytes = t.numel() * t.element_size()
        buf = torch.zeros(-(-nbytes // 4), dtype=torch.int32, device=t.device)
        root = opts.rootRank
        if self._rank == root:
            src = t.detach().resolve_conj().resolve_neg().reshape(-1)
            buf.view(torch.uint8)[:nbytes].copy_(src.view(torch.uint8))
            return self._through_switch(buf, "sum", lambda: tensors,  # the root keeps its own
                                        outputs=tuple(tensors))

        def finish():
            t.detach().copy_(buf.view(torch.uint8)[:nbytes].view(t.dtype).view_as(t))
            return tensors

        return self._through_switch(buf, "sum", finish, outputs=tuple(tensors))

    def barrier(self, opts=None):
        """One 1-element int32 round: it completes when every rank has made it,
        after this rank's earlier switch calls (the Worker runs them in order)
        and its pending Gloo work (waited for here, as Gloo's barrier does)."""
        with self._lock:
            pending, self._gloo_pending = self._gloo_pending, []
        for w in pending:
            w.wait()
        return self._through_switch(torch.zeros(1, dtype=torch.int32), "sum", lambda: [])

    # -- everything else is Gloo's (by design: no warning, no count) ----------------
    def allgather(self, output_tensors, input_tensors, opts):
        return self._gloo(self.gloo.allgather(output_tensors, input_tensors, opts))

    def all_gather_single(self, output, input, opts):
        return self._gloo(self.gloo._allgather_base(output, input, opts))

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts):
        return self._gloo(self.gloo.allgather_coalesced(output_lists, input_list, opts))

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        works = [self.gloo._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        for w in works[:-1]:
            w.wait()
        return self._gloo(works[-1])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts):
        return self._gloo(self.gloo.gather(output_tensors, input_tensors, opts))

    def scatter(self, output_tensors, input_tensors, opts):
        return self._gloo(self.gloo.scatter(output_tensors, input_tensors, opts))

    def reduce(self, tensors, opts):
        return self._gloo(self.gloo.reduce(tensors, opts))

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        return self._gloo(self.gloo.reduce_scatter(output_tensors, input_tensors, opts))

    def reduce_scatter_single(self, output, input, opts):
        return self._gloo(self.gloo._reduce_scatter_base(output, input, opts))

    _reduce_scatter_base = reduce_scatter_single

    def alltoall(self, output_tensors, input_tensors, opts):
        return self._gloo(self.gloo.alltoall(output_tensors, input_tensors, opts))

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        return self._gloo(self.gloo.alltoall_base(output, input, output_split_sizes,
                                                  input_split_sizes, opts))

    alltoall_base = all_to_all_single

    def send(self, tensors, dst, tag):
        return self._gloo(self.gloo.send(tensors, dst, tag))

    def recv(self, tensors, src, tag):
        return self._gloo(self.gloo.recv(tensors, src, tag))

    def recv_anysource(self, tensors, tag):
        return self._gloo(self.gloo.recv_anysource(tensors, tag))

    def monitored_barrier(self, *args, **kwargs):
        return self.gloo.monitored_barrier(*args, **kwargs)

    # -- life cycle -------------------------------------------------------------
    def _close_switch_side(self) -> None:
        try:
            if self.worker is not None:
                self.worker.close()
        finally:
            if self.local is not None:
                self.local.shutdown()

    def shutdown(self) -> None:
        """Leave the job on the switch (after the queued reductions) and stop Gloo."""
        if self._closed:
            return
        self._closed = True
        _live.discard(self)
        try:
            self._pipeline.shutdown(wait=True)
            self._close_switch_side()
        finally:
            self.gloo.shutdown()

    def abort(self) -> None:
        self.shutdown()


# Process groups still open at exit leave their job cleanly: a worker that just
# disappears makes the switch abort the job under ranks still finishing up.
_live: "weakref.WeakSet[ProcessGroupSwml]" = weakref.WeakSet()


@atexit.register
def _close_live_groups() -> None:
    for pg in list(_live):
        try:
            pg._pipeline.shutdown(wait=True)
            if pg.worker is not None:
                pg.worker.close()
        except Exception:  # noqa: BLE001 - exiting anyway
            pass


def _create(backend_opts, pg_options) -> ProcessGroupSwml:
    """The creator torch calls (extended API: it hands us pg_options)."""
    if pg_options is not None and not isinstance(pg_options, SwmlOptions):
        raise TypeError(f"the swml backend takes pg_options=SwmlOptions(...), "
                        f"not {type(pg_options).__name__}")
    return ProcessGroupSwml(backend_opts.store, backend_opts.group_rank, backend_opts.group_size,
                            backend_opts.timeout, pg_options, str(backend_opts.group_id))


def register() -> None:
    """Register the backend as "swml" (done on import of switchml_xdp.torch)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        # "cuda" where torch is built with it: CUDA tensors then reach this group
        # (staged through host memory, staging.py) instead of torch refusing them.
        devices = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)
