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
- `barrier`: one int32 round through the switch, after this group's Gloo
  collectives (not sends/receives). Failures: docs/pytorch.md, "When a call fails".
- Everything else that the switch could be asked for (PRODUCT, bitwise ops,
  other dtypes, tensors on other devices, lists of several tensors) falls back to a Gloo
  process group built from the same store, with one warning per kind per
  process group; `fallbacks` counts those calls, `switch_calls` the others.
- The rest is Gloo's by design (reduce_scatter: the switch's on request, reduce_scatter.py).

Configuration: `pg_options=SwmlOptions(...)`, or the environment:
SWML_SWITCH (the switch's address, required one way or the other), SWML_JOB
(the job name; by default rank 0 makes one up and shares it through the
store; the job's token is always made by rank 0 with `secrets` and shared the
same way, so only this process group's ranks can change the job on the switch),
SWML_WORKER_BACKEND (auto, udp or afxdp; default auto), SWML_PORT (the port
a group tries first), SWML_SHM_BYTES (shared memory per rank of a host,
default 4 MiB), SWML_LANES (the Worker's lanes, default 1). Subgroups
(new_group): each its own job and ports, picked by the group (group_setup.py;
docs/pytorch.md, "Subgroups").
Gloo's device: GLOO_SOCKET_IFNAME's interface if set, else the switch's route's.

Several ranks on one host (torchrun --nproc_per_node=R) reduce into their lowest
rank through shared memory; only that leader joins the switch's job (rank =
host index, world = number of hosts) and streams; the result goes back (hosts.py).
CUDA tensors take the same road from their staged host copies: each rank
quantizes for the whole group's size, and the int32 payloads add up on the
leader's host (exact in any order), so no NCCL is needed.

Switch and Gloo work are separate channels: a switch all_reduce issued with
async_op=True runs on the group's own thread while later Gloo collectives
proceed. Calls through the switch run in the order made, the same on every rank.
"""
from __future__ import annotations

import atexit
import contextlib
import datetime
import secrets
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllreduceCoalescedOptions, AllreduceOptions

from ..client.api import Worker, local_end
from ..client.boxes import ports_used
from ..client.port import release_held
from .box_failover import WorkerRecipe, failover_for
from .compile_opaque import compile_opaque
from .gloo_side import GlooSide
from .group_setup import SetupPhases, agree_port
from .group_stats import CallLog
from .hosts import HostLayout, LocalGroup, agree_layout, open_local_group, refuse_for_host
from .options import BACKEND_NAME, SwmlOptions
from .reduce_scatter import SwitchReduceScatter
from .routing import SWITCH_OPS, WORK_DTYPE, allreduce_reason, op_name, tensor_reason
from .staging import Pipeline, ops_for
from .work import FutureWork, call_failed

_JOB_KEY = "swml/job"
_K_KEY = "swml/k"
_TOKEN_KEY = "swml/token"


@compile_opaque
class ProcessGroupSwml(SwitchReduceScatter, GlooSide, dist.ProcessGroup):
    """The `swml` process group: all_reduce through the switch, the rest through
    Gloo (gloo_side.py)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta,
                 options: SwmlOptions | None = None, group_id: str = ""):
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        opts = (options or SwmlOptions()).resolved()
        self.options = opts
        job = opts.job or self._agree_job_name(store, rank, group_id)
        token = self._agree_token(store, rank)
        join_timeout = max(10.0, min(timeout.total_seconds(), 300.0))
        # The address the (first) switch would see: ranks that share it share a host.
        here = local_end(opts.switch.split(",")[0].strip(), opts.control_port, opts.iface)
        self.layout: HostLayout = agree_layout(store, rank, size, here.ip)
        self.local: LocalGroup | None = None
        self.worker: Worker | None = None
        # Each group its own job and port; a failure fails every member alike (group_setup.py).
        phases = SetupPhases(store, rank, size, max(timeout.total_seconds(), join_timeout + 15),
                             f"the swml process group {group_id or 'pg'} ({size} ranks)")
        port = None
        # Every port of the group's Worker (client/boxes.py, box_port): agreed on, all of them.
        ports = ports_used(opts.switch, opts.lanes)
        try:
            with phases.phase("ready"):
                if len(self.layout.local_ranks) > 1:
                    self.local = open_local_group(store, self.layout, timeout, opts.shm_bytes)
                if self.layout.is_leader:
                    port = agree_port(store, self.layout, opts.port, phases.timeout_s, ports,
                                      align=opts.lanes)
            with phases.phase("joined"):
                recipe = WorkerRecipe(opts, job, token, self.layout.host_index, self.layout.n_hosts,
                                      port, timeout.total_seconds())
                if self.layout.is_leader:
                    self.worker = recipe.make(opts.switch, join_timeout)
                if rank == 0:
                    store.set(_K_KEY, str(self.worker.info.k))
            # Every rank quantizes its own GPU tensors (staging.py): with the job's block size.
            self.k = int(store.get(_K_KEY).decode())
        except BaseException:
            release_held(port, ports)
            self._close_switch_side()
            raise
        # One thread runs the switch calls in order: local reduce, the
        # leader's stream, the local share.
        self._pipeline = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"swml-pg{rank}")
        try:
            self._open_gloo(store, rank, size, timeout, opts.gloo_iface, here.iface)
            self.failover = failover_for(self, store, recipe, timeout, here.iface)  # lost boxes
        except BaseException:
            self._close_switch_side()
            raise
        self.switch_calls = 0       # all_reduce/broadcast/barrier calls through the switch
        self.calls = CallLog(rank)  # bytes, Gloo's calls, SWML_DEBUG lines (group_stats.py)
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

    @staticmethod
    def _agree_token(store: dist.Store, rank: int) -> str:
        """Rank 0 makes the job's token; the others read it from the store
        (which only the process group's members reach)."""
        if rank == 0:
            store.set(_TOKEN_KEY, secrets.token_hex(16))
        return store.get(_TOKEN_KEY).decode()

    # -- identity -------------------------------------------------------------
    def getBackendName(self) -> str:  # camelCase: the C++ name the trampoline looks up
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

    # -- through the switch -------------------------------------------------------
    def _reduce_among_all(self, flat: torch.Tensor, op: str) -> None:
        """Reduce a contiguous 1-D float32/int32 CPU tensor in place with the
        Worker's `op` over every rank: first among each host's ranks, then
        through the switch among the hosts' leaders, then shared back."""
        through = self.failover if self.layout.is_leader else None   # box_failover.py
        if self.local is not None:
            try:
                self.local.reduce_to_leader(flat, op.upper())
            except BaseException:
                refuse_for_host(through, flat, op)    # the call fails on every host
                raise
        error = None
        if through is not None:
            try:
                through.allreduce(flat.detach().numpy(), op)
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
                        outputs: tuple = (), what: str = "all_reduce", reduce=None) -> FutureWork:
        """Reduce a contiguous 1-D float32/int32 tensor in place with the
        Worker's `op` over every rank (by reduce(flat, op) if given, else
        _reduce_among_all); finish() runs after, on the group's thread, and
        returns the future's value (it writes `outputs`).

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
            call = f"{what} #{self.switch_calls} on rank {self._rank}"    # errors name it
        self.calls.through_switch(op, flat)
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
                        (reduce or self._reduce_among_all)(flat, op)
                    if avg:
                        flat.div_(size)   # in float32, before any rounding to float16/bfloat16
                    value = finish()
                    # on the side stream: a CUDA future records its events there
                    fut.set_result(value)
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                if not fut.done():
                    fut.set_exception(call_failed(call, e))

        self._pipeline.submit(run)
        return FutureWork(fut, call, self.group_timeout)

    def _reduce(self, tensors: list[torch.Tensor], op) -> FutureWork:
        """all_reduce of tensors that routing.allreduce_reason passed: in place when
        one contiguous tensor is already the Worker's dtype, else through one
        flat buffer of it, copied (rounded, for float16/bfloat16) back."""
        name = op_name(op)
        work_dtype = WORK_DTYPE[tensors[0].dtype]
        t = tensors[0]
        # detach(): the result is written into the tensors' storage, as Gloo writes
        # it, also into parameters that require grad (autograd refuses copy_ there).
        if len(tensors) == 1 and t.dtype == work_dtype and t.is_contiguous():
            return self._through_switch(t.detach().view(-1), SWITCH_OPS[name], lambda: tensors,
                                        avg=name == "AVG", outputs=tuple(tensors))
        flat = torch.cat([x.detach().reshape(-1).to(work_dtype) for x in tensors])

        def finish():
            off = 0
            for x in tensors:
                n = x.numel()
                x.detach().copy_(flat[off:off + n].view_as(x))
                off += n
            return tensors

        return self._through_switch(flat, SWITCH_OPS[name], finish, avg=name == "AVG",
                                    outputs=tuple(tensors))

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        if opts is None:
            opts = AllreduceOptions()
        elif not isinstance(opts, AllreduceOptions):  # allreduce(tensors, op)
            op, opts = opts, AllreduceOptions()
            opts.reduceOp = op
        reason = allreduce_reason("all_reduce", tensors, opts.reduceOp)
        if reason:
            return self._fallback(reason, lambda: self.gloo.allreduce(tensors, opts))
        return self._reduce(tensors, opts.reduceOp)

    def allreduce_coalesced(self, tensors, opts=None):
        if opts is None:
            opts = AllreduceCoalescedOptions()
        reason = allreduce_reason("all_reduce_coalesced", tensors, opts.reduceOp)
        if reason:
            return self._fallback(reason, lambda: self.gloo.allreduce_coalesced(tensors, opts))
        return self._reduce(tensors, opts.reduceOp)

    def broadcast(self, tensors, opts):
        """The root's bytes as int32 (zero-padded to a multiple of 4), every
        other rank's zeros: the switch's int32 sum is the root's bits, exactly."""
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        reason = tensor_reason("broadcast", tensors)
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
                                        outputs=tuple(tensors), what="broadcast")

        def finish():
            t.detach().copy_(buf.view(torch.uint8)[:nbytes].view(t.dtype).view_as(t))
            return tensors

        return self._through_switch(buf, "sum", finish, outputs=tuple(tensors), what="broadcast")

    def barrier(self, opts=None):
        """One 1-element int32 round, after this rank's earlier switch calls
        (run in order) and Gloo collectives (as Gloo's barrier waits for them;
        not its sends/receives, which a peer may take after the barrier)."""
        issued = self._gloo_issued()

        def finish():
            self._wait_for_gloo(issued)
            return []

        return self._through_switch(torch.zeros(1, dtype=torch.int32), "sum", finish,
                                    what="barrier")

    # -- life cycle -------------------------------------------------------------
    def _close_switch_side(self) -> None:
        try:
            if getattr(self, "failover", None) is not None:
                self.failover.close()
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

    def _leave_at_exit(self) -> None:
        """At the interpreter's exit: finish the queued reductions and leave
        the job (the switch side of shutdown())."""
        self._pipeline.shutdown(wait=True)
        if self.worker is not None:
            self.worker.close()


# Process groups still open at exit leave their job cleanly: a worker that just
# disappears makes the switch abort the job under ranks still finishing up.
_live: weakref.WeakSet[ProcessGroupSwml] = weakref.WeakSet()


@atexit.register
def _close_live_groups() -> None:
    for pg in list(_live):
        try:
            pg._leave_at_exit()
        except Exception:  # noqa: BLE001 - the process exits anyway; the next group still leaves
            pass
