"""The public worker API: `Worker(switch, job, rank, world)`.

A Worker joins its job on the switch (waiting for every rank), then reduces
tensors in place through the switch. Calls run one at a time, in the order they
were made, on the worker's own thread; `allreduce` waits, `allreduce_async`
returns a future. Every rank must make the same calls in the same order:
each call carries a tag of its number, length, dtype and op (calls.py), and
ranks that disagree all get CallMismatch naming the call, never a wrong result.

One host is one rank of a job: the switch sends results to one address and
port per member, and refuses a second rank of the job from the same address.
Ranks that share a host (torchrun --nproc_per_node) reduce among themselves
first and let one leader a host run the Worker; the torch backend does this
(docs/pytorch.md). Different jobs on one host need different ports.
"""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .. import mtu, net, wire
from .backend import STAT_KEYS, Backend, LocalEnd
from .box_watch import BOX_TIMEOUT_S, BoxSignal
from .boxes import Box, BoxSplit, box_port, check_same_k, named, parse_switches
from .calls import Call, CallMismatch, check_precision, op_code
from .control import ControlClient, ControlError, JobInfo
from .engine_backend import check_lanes, lanes_from_env
from .plans import streamed
from .retransmit import STALL_TIMEOUT_S
from .window import WindowPolicy, window_policy

BACKENDS = ("auto", "afxdp", "udp")


def local_end(switch: str, port: int, iface: str | None) -> LocalEnd:
    """This worker's address, interface (the route's to the switch unless
    given) and MAC: the worker's only link lookups (switchml_xdp.net)."""
    try:
        local_ip, route_iface = net.route_to(switch, port)
        iface = iface or route_iface
        return LocalEnd(local_ip, iface, net.link_mac(iface))
    except net.NetError as e:
        raise ControlError(f"cannot reach the switch {switch}: {e}") from None


def _afxdp_unavailable_reason() -> str | None:
    try:
        from . import afxdp_backend
    except ImportError as e:
        return f"the AF_XDP engine is not built ({e})"
    return afxdp_backend.unavailable_reason()


class Worker:
    """One rank of a job. Use as a context manager, or call close()."""

    def __init__(self, switch: str | Sequence[str], job: str, rank: int, world: int,
                 iface: str | None = None,
                 backend: str = "auto", port: int = wire.DEFAULT_PORT,
                 control_port: int = wire.DEFAULT_CONTROL_PORT, join_timeout: float = 60.0,
                 stall_timeout: float = STALL_TIMEOUT_S, verbose: bool = True, token: str | None = None,
                 window: WindowPolicy | None = None, box_timeout: float = BOX_TIMEOUT_S,
                 lanes: int | None = None):
        """token: the job's secret, the same on every rank; without it, nothing
        that changes the job is accepted by the switch (docs/security.md).
        None: an open job, which anyone who reaches the switch can disturb.
        window: the congestion window and pacing (client/window.py; None: the
        default, or what SWML_WINDOW* in the environment say; NO_WINDOW: all
        the job's slots at once, no pacing).
        switch: one box's address, or several ("A,B" or a list): the job
        joins every box, and each tensor is split over them by their
        capacity (client/boxes.py; box i's ports from port + i x lanes: box_port).
        box_timeout: a box that stops answering (no result, and no answer
        on its control connection) fails the call within this many seconds
        as BoxLost, naming it (client/box_watch.py); a box that answers is
        waited for up to stall_timeout (a slow peer rank).
        lanes: split the job's stream into this many lanes, a power of two
        up to wire.MAX_LANES, the same on every rank: each a socket and a
        thread of its own on ports port..port+lanes-1 (docs/performance.md,
        "Several queues per worker"); on the C engine (udp, or afxdp where
        the NIC steers lane q's port to its receive queue q; "auto" picks udp).
        None: $SWML_LANES where set (torchrun's ranks), else 1."""
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
        if not isinstance(world, int) or world < 1:
            raise ValueError(f"world must be a positive integer, not {world!r}")
        if not isinstance(rank, int) or not 0 <= rank < world:
            raise ValueError(f"rank must be in 0..{world - 1}, not {rank!r}")
        lanes = lanes_from_env() if lanes is None else lanes
        check_lanes(lanes)
        self.lanes = lanes
        self.switches = parse_switches(switch)
        self.local = local_end(self.switches[0], control_port, iface)
        self.iface, self.local_ip = self.local.iface, self.local.ip
        self.backend_name = self._choose_backend(backend, verbose, lanes)
        self._requested_backend, self._verbose = backend, verbose
        self._window = window_policy(window)
        listed = ",".join(self.switches) if len(self.switches) > 1 else None
        self._boxes: list[Box] = []
        self._redirect = (self._compile_redirect(box_port(port, 0, lanes), lanes)
                          if self.backend_name == "afxdp" else None)
        try:
            for i, address in enumerate(self.switches):
                self._boxes.append(self._join_box(i, address, job, world, rank,
                                                  box_port(port, i, lanes), control_port, iface,
                                                  join_timeout, token, listed, stall_timeout))
            check_same_k(self._boxes)
        except BaseException:
            for box in self._boxes:
                box.close()
            if self._redirect is not None:   # not yet the backend's
                self._redirect.close()
            raise
        first = self._boxes[0]
        self._control, self.info, self._backend = first.control, first.info, first.backend
        self._split = BoxSplit(self._boxes, box_timeout)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"swml-r{rank}")
        self._lock = threading.Lock()
        self._calls = 0  # calls made on this Worker: part of each call's tag
        self._submit_lock = threading.Lock()
        self._stats = {"tensors": 0, "elements": 0, "seconds": 0.0}
        self._closed = False

    def _choose_backend(self, backend: str, verbose: bool, lanes: int) -> str:
        if backend == "udp":
            return "udp"
        if backend == "auto" and lanes > 1:
            # afxdp's lanes need the NIC to steer each lane's port to its
            # queue, which nothing here can check: asked for, not assumed.
            if verbose:
                print("switchml-xdp: backend auto -> udp (lanes; backend afxdp streams them where "
                      "the NIC steers port + q to queue q)", file=sys.stderr)
            return "udp"
        reason = _afxdp_unavailable_reason()
        if backend == "afxdp":
            if reason:
                raise RuntimeError(f"afxdp backend unavailable: {reason}")
            return "afxdp"
        chosen = "udp" if reason else "afxdp"
        if verbose:
            why = f" ({reason})" if reason else " (kernel bypass available)"
            print(f"switchml-xdp: backend auto -> {chosen}{why}", file=sys.stderr)
        return chosen

    def _compile_redirect(self, port: int, lanes: int):
        """The afxdp datapath's redirect program, compiled before the join:
        a second or more of bcc, which after the join's barrier would make
        every rank that compiles faster wait for the slowest in the job's
        first call, resending (docs/transport.md, "A late rank"). A failure
        under backend "auto" falls back to udp here, before anything joined."""
        from .afxdp_backend import compile_redirect
        try:
            return compile_redirect(port, self.local_ip, lanes)
        except RuntimeError as e:
            self._afxdp_failed(e)
            return None

    def _afxdp_failed(self, e: BaseException) -> None:
        """The afxdp datapath could not be set up: raise, or under backend
        "auto" go on with udp (same port and address, same protocol: udp can
        take over the join)."""
        if self._requested_backend != "auto":
            raise e
        if self._verbose:
            print(f"switchml-xdp: afxdp set-up failed on {self.iface} ({e}); "
                  "backend auto -> udp", file=sys.stderr)
        self.backend_name = "udp"

    def _join_box(self, i: int, address: str, job: str, world: int, rank: int, port: int,
                  control_port: int, iface: str | None, join_timeout: float, token: str | None,
                  listed: str | None, stall_timeout: float) -> Box:
        """Join the job on box i and set up its datapath."""
        local = self.local if i == 0 else local_end(address, control_port, iface)
        control = ControlClient(address, control_port)
        try:
            info = control.join(job, world, rank, local.ip, port, local.mac, join_timeout,
                                token=token, boxes=listed, lanes=self.lanes)
            mtu.check_iface(info.k, local.iface)   # the switch's k, over this worker's link
            signal = BoxSignal(control.abort)
            return Box(address, control, info, self._make_backend(i, info, local, signal,
                                                                  stall_timeout), signal)
        except BaseException as e:
            control.close()
            if listed is not None and isinstance(e, (ControlError, OSError)):
                raise type(e)(f"box {address}: {e}") from None
            raise

    def _make_backend(self, i: int, info: JobInfo, local: LocalEnd, signal: BoxSignal,
                      stall_timeout: float) -> Backend:
        args = (info, local, signal)
        kw = {"stall_timeout": stall_timeout, "window": self._window, "verbose": self._verbose}
        if self.backend_name == "afxdp" and i > 0:
            # One AF_XDP datapath a host and interface for now: the job's
            # other boxes stream over udp (docs/scale-out.md).
            if self._verbose:
                print(f"switchml-xdp: box {info.switch_ip} on udp (box {self.switches[0]} has the "
                      f"AF_XDP datapath)", file=sys.stderr)
        elif self.backend_name == "afxdp":
            from .afxdp_backend import AfxdpBackend
            prog, self._redirect = self._redirect, None   # the backend owns it now
            try:
                return AfxdpBackend(*args, prog=prog, **kw)
            except (RuntimeError, OSError) as e:
                self._afxdp_failed(e)
        from .udp_backend import udp_backend
        return udp_backend(*args, **kw)

    # --- the API -------------------------------------------------------------
    def allreduce(self, array: np.ndarray, op: str = "sum", precision: str = "32") -> np.ndarray:
        """Reduce `array` over all ranks with op "sum", "min" or "max", in place
        (float32 or int32); returns it. int32 and float32 min/max are exact;
        a float32 sum is quantized (docs/quantization.md), to 32 bits or, with
        precision="16", to the 16-bit block format (half the bytes, bound
        (B16)). Raises CallMismatch if the ranks did not make the same call
        (length, dtype, op or precision). An empty array comes back as it
        was, after one round that keeps the ranks' calls in step
        (docs/protocol.md, "Empty calls")."""
        return self.allreduce_async(array, op, precision).result()

    def allreduce_async(self, array: np.ndarray, op: str = "sum",
                        precision: str = "32") -> Future:
        """Start an allreduce; the future's result is the (reduced) array."""
        self._check_call(array, op, precision, "allreduce")
        return self._submit(array, op, precision)

    def reduce_scatter(self, array: np.ndarray, op: str = "sum",
                       precision: str = "32") -> np.ndarray:
        """Reduce `array` (its size a multiple of world) over all ranks as
        allreduce does, keeping only this rank's shard of the result: returns
        the view array.reshape(-1)[rank * L:(rank + 1) * L], L = size / world;
        the rest of `array` is left unspecified. Through a switch with
        `--fanout unicast` each rank receives only the packets of its own
        shard whole, and the header of the others (docs/protocol.md, "Shards")."""
        return self.reduce_scatter_async(array, op, precision).result()

    def reduce_scatter_async(self, array: np.ndarray, op: str = "sum",
                             precision: str = "32") -> Future:
        """Start a reduce_scatter; the future's result is this rank's shard."""
        self._check_call(array, op, precision, "reduce_scatter")
        world = self.info.world
        if not array.size or array.size % world:
            raise ValueError(f"reduce_scatter needs a non-empty array whose size is a multiple of "
                             f"the world ({world}), not {array.size} elements")
        return self._submit(array, op, precision, shard=array.size // world)

    def _check_call(self, array: np.ndarray, op: str, precision: str, what: str) -> None:
        """A ValueError or TypeError, before anything is queued or sent."""
        op_code(op)
        if self._closed:
            raise RuntimeError("this Worker is closed")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"{what} takes a numpy array, not {type(array).__name__}")
        if array.dtype not in (np.float32, np.int32):
            raise TypeError(f"{what} supports float32 and int32 arrays, not {array.dtype}")
        check_precision(precision, array.dtype, op)
        for info in (b.info for b in self._boxes):
            if precision == "16" and info.parent is not None:
                raise ValueError(f"precision '16' cannot go through a tree of boxes: the rack box "
                                 f"{info.switch_ip} sends its rack's sums up to {info.parent} in "
                                 f"32 bits (docs/scale-out.md, \"A tree of boxes\"); use '32'")
        if precision not in self.precisions:
            raise ValueError(f"the {self.backend_name} backend does not stream precision "
                             f"{precision!r} yet (it does {', '.join(self.precisions)})")
        if not array.flags.c_contiguous:
            raise ValueError(f"{what} works in place and needs a C-contiguous array "
                             "(np.ascontiguousarray makes one; copy the result back)")
        if not array.flags.writeable:
            raise ValueError(f"{what} works in place and needs a writeable array")

    def _submit(self, array: np.ndarray, op: str, precision: str = "32",
                refused: bool = False, shard: int = 0) -> Future:
        with self._submit_lock:  # numbers in the order the calls run
            call = Call(self._calls, self.info.name, array.size, array.dtype.name, op,
                        precision, refused, shard)
            self._calls += 1
            return self._executor.submit(self._reduce, array, call)

    def refuse_call(self, count: int, dtype: str = "float32", op: str = "sum") -> None:
        """Take this rank's turn in the next call without a contribution: it
        streams `count` zeros under a tag that no rank's call has, so the
        call fails with CallMismatch on every rank of the job (here it is
        expected, and not raised) and the job goes on in step with the next
        call. For a rank that failed the call before it could stream (the
        torch backend's host leader whose host's ranks disagree)."""
        done = self._submit(np.zeros(count, dtype=dtype), op, refused=True)
        try:
            done.result()
        except CallMismatch:
            pass

    @property
    def precisions(self) -> tuple[str, ...]:
        """The precisions this Worker's datapath streams (allreduce's `precision`):
        over several boxes, those every box's datapath streams."""
        return tuple(p for p in self._backend.precisions
                     if all(p in b.backend.precisions for b in self._boxes))

    def _reduce(self, array: np.ndarray, call: Call) -> np.ndarray:
        with self._lock:
            self._split.begin()
            for box in self._boxes:
                try:
                    box.control.abort.raise_if_set(self.info.name)
                except BaseException as e:
                    e.lost_boxes = (box.address,)
                    if len(self._boxes) == 1:
                        raise
                    raise named(box, call, e) from None
            t0 = time.perf_counter()
            self._split.reduce(streamed(array), call)
            self._stats["tensors"] += 1
            self._stats["elements"] += array.size
            self._stats["seconds"] += time.perf_counter() - t0
        if call.shard:
            mine = self.info.rank * call.shard
            return array.reshape(-1)[mine:mine + call.shard]
        return array

    def interrupt(self, reason: str) -> None:
        """Stop the call in progress, if any: it fails with CallInterrupted
        (`reason`) unless it finishes first or a box is lost. For a caller
        that learned elsewhere that the call cannot finish (the torch
        backend: another rank lost a box, torch/box_failover.py)."""
        self._split.interrupt(reason)

    def forget(self, boxes) -> None:
        """Boxes that close() asks nothing (found lost elsewhere: a leave
        would wait for its timeout)."""
        for box in self._boxes:
            box.lost = box.lost or box.address in boxes

    def stats(self) -> dict:
        """Counters of this worker: tensors, elements, packets, retransmissions
        (over several boxes: their sums, and each box's under "boxes"); its
        backend, and the loop that streams ("engine": the C engine, "python":
        the udp backend's Python loop where the engine is not built)."""
        out = {"backend": self.backend_name, "loop": self._backend.loop,
               "job": self.info.name, "job_id": self.info.job_id,
               "rank": self.info.rank, "world": self.info.world, "k": self.info.k,
               "slots": self.info.slots, **self._stats, **self._backend.stats()}
        if len(self._boxes) > 1:
            per_box = [box.stats() for box in self._boxes]
            for key in STAT_KEYS:
                out[key] = sum(b.get(key, 0) for b in per_box)
            out["boxes"] = per_box
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        self._split.close()
        for box in self._boxes:
            box.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
