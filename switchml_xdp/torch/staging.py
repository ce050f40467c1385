"""GPU tensors through the switch: quantize on the device, stage the int32
payload through pinned host memory in chunks, and copy the sums back.

The switch and the Worker see host memory only. For a tensor on a GPU
(docs/pytorch.md, "GPU"):

1. the caller's stream is marked (an event) at call time; the pipeline's own
   stream waits on that mark before it reads the tensor;
2. block exponents on the device (device_quant), one small int32 MAX round
   (staged like the payload, below), then the int32 payload quantized on the
   device;
3. the payload goes to the host chunk by chunk, through a bounded ring of
   reusable (pinned) host buffers: while the Worker streams chunk i, the
   copies of the next chunks to the host are already running on the device
   (asynchronous copies on a side stream), and chunk i-1's sums are being
   copied back on another;
4. the sums are dequantized on the device, on the pipeline's stream; a future
   (CUDA-aware) or an event hands the result to the caller's stream.

The device-specific operations (a host staging buffer, an asynchronous copy
on a stream, events) sit behind `DeviceOps`. `CpuOps` runs everything at once
on plain tensors: CI drives the chunking and ordering logic through it (and
through a deferred-copy variant in tests/unit/test_staging.py that runs each copy
only when an event says it must have run, so a missing wait shows up as a
wrong result), bit for bit against quant.simulate_allreduce. `CudaOps` is the
same contract with torch.cuda streams, events and pinned memory.

Every rank must stage with the same `StagingConfig`: the chunks are Worker
calls, and ranks whose calls differ in length get CallMismatch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from . import device_quant

# (host tensor, op) -> None: reduce a contiguous 1-D int32 or float32 CPU tensor
# in place over every rank, exactly, with op "max", "min" or "sum".
HostAllreduce = Callable[[torch.Tensor, str], None]


@dataclass(frozen=True)
class StagingConfig:
    """How device tensors are staged through host memory.

    chunk_elements: 4-byte words per chunk (one Worker call each); a few MiB
    keep the Worker's per-call start-up small against the streaming time.
    buffers: host buffers in the ring, reused from call to call; with 2 or
    more, the next chunk's copy to the host overlaps this chunk's streaming.
    """
    chunk_elements: int = 1 << 20
    buffers: int = 3

    def __post_init__(self):
        if self.chunk_elements < 1 or self.buffers < 1:
            raise ValueError(f"staging needs chunk_elements >= 1 and buffers >= 1, not {self}")


class DeviceOps(Protocol):
    """What the pipeline needs from a device. Streams and events are opaque."""
    device: torch.device

    def host_buffer(self, words: int) -> torch.Tensor: ...          # int32, on the host
    def new_stream(self): ...
    def current_stream(self): ...
    def use_stream(self, stream) -> contextlib.AbstractContextManager: ...
    def record(self, stream): ...                                   # an event, recorded now
    def wait(self, stream, event) -> None: ...                      # the stream waits (device side)
    def synchronize(self, event) -> None: ...                       # the host waits
    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None: ...   # asynchronous
    def keep_alive(self, tensor: torch.Tensor, stream) -> None: ... # allocator: used on stream
    def future(self) -> torch.futures.Future: ...                   # synchronizes with streams


class CpuOps:
    """Plain tensors and synchronous copies: nothing is ever pending, so every
    event is complete when recorded. What CI runs the pipeline with."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def host_buffer(self, words: int) -> torch.Tensor:
        return torch.empty(words, dtype=torch.int32)

    def new_stream(self):
        return None

    def current_stream(self):
        return None

    def use_stream(self, stream):
        return contextlib.nullcontext()

    def record(self, stream):
        return None

    def wait(self, stream, event) -> None:
        pass

    def synchronize(self, event) -> None:
        pass

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        dst.copy_(src)

    def keep_alive(self, tensor: torch.Tensor, stream) -> None:
        pass

    def future(self) -> torch.futures.Future:
        return torch.futures.Future()


class CudaOps:
    """torch.cuda streams and events, page-locked host buffers (so that the
    copies are DMA transfers that run asynchronously to the host)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def host_buffer(self, words: int) -> torch.Tensor:
        return torch.empty(words, dtype=torch.int32, pin_memory=True)

    def new_stream(self):
        return torch.cuda.Stream(self.device)

    def current_stream(self):
        return torch.cuda.current_stream(self.device)

    @contextlib.contextmanager
    def use_stream(self, stream):
        # the device too: on the process group's thread the current device is
        # the default one, and tensors made there must land on ours
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            yield

    def record(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait(self, stream, event) -> None:
        stream.wait_event(event)

    def synchronize(self, event) -> None:
        event.synchronize()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def keep_alive(self, tensor: torch.Tensor, stream) -> None:
        # The caching allocator ties a block to the stream it was allocated on;
        # without this, a tensor the caller frees while our stream still reads
        # or writes it could be handed out again on the caller's stream
        # (ProcessGroupNCCL records its inputs on its stream the same way).
        tensor.record_stream(stream)

    def future(self) -> torch.futures.Future:
        # A CUDA-aware future: set_result records events on the current
        # streams (ours, see Pipeline.on_stream), and wait()/value()/then()
        # make the waiter's current stream wait on them.
        return torch.futures.Future(devices=[self.device])


def ops_for(device: torch.device) -> DeviceOps | None:
    """The device operations for a tensor's device; None where there are none
    (the caller then keeps such tensors off the switch)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaOps(device)
    if device.type == "cpu":
        return CpuOps(device)
    return None


@dataclass(frozen=True)
class Ticket:
    """A call accepted on the caller's thread: the caller's stream as it was."""
    ready: object          # event on the caller's stream, after the input was written


class Pipeline:
    """Stages one device's tensors through host memory; one thread at a time
    (the process group's or the hook's), calls in order.

    Two side streams: `work` (the quantization, the copies to the host, the
    dequantization) and `back` (the copies to the device, on the other copy
    engine where the GPU has two)."""

    def __init__(self, ops: DeviceOps, config: StagingConfig | None = None):
        self.ops = ops
        self.config = config or StagingConfig()
        self.work = ops.new_stream()
        self.back = ops.new_stream()
        self._ring: list[torch.Tensor] = []    # host buffers, kept from call to call
        self.chunks = 0                        # Worker calls made for payload and exponents

    # -- the caller's side ------------------------------------------------------
    def accept(self, tensors: list[torch.Tensor]) -> Ticket:
        """On the caller's thread, at call time: mark the caller's current
        stream (everything that wrote the inputs is before the mark) and
        tell the allocator that our streams use these tensors."""
        for t in tensors:
            self.ops.keep_alive(t, self.work)
            self.ops.keep_alive(t, self.back)
        return Ticket(self.ops.record(self.ops.current_stream()))

    @contextlib.contextmanager
    def on_stream(self, ticket: Ticket) -> Iterator[None]:
        """The pipeline's stream as the current one, after the caller's mark:
        run the reduction, the caller's finishing copies and the future's
        set_result inside this, so that the future's events cover them."""
        self.ops.wait(self.work, ticket.ready)
        with self.ops.use_stream(self.work):
            yield

    # -- the reductions (inside on_stream) --------------------------------------
    def sum_quantized(self, x: torch.Tensor, k: int, world: int,
                      allreduce: HostAllreduce) -> torch.Tensor:
        """The float32 SUM over the ranks of x (float32/float16/bfloat16 on the
        device), quantized as the switch quantizes: device_quant's formulas, the
        exponents' MAX and the payload's SUM each staged through the host.
        A new float32 tensor of x's shape, on x's device."""
        exp, nonfinite = device_quant.block_exponents(x, k)
        # exponents and non-finite flags: two words a block, one MAX round
        agreed = torch.stack([exp, nonfinite.to(torch.int32)], dim=1).reshape(-1)
        self.reduce(agreed, "max", allreduce)
        agreed = agreed.view(-1, 2)
        exp_global, nonfinite_any = agreed[:, 0], agreed[:, 1].to(torch.bool)
        q = device_quant.quantize(x, k, exp_global, world)
        self.reduce(q.view(-1), "sum", allreduce)
        return device_quant.dequantize(q, exp_global, nonfinite_any, world, x.numel()).view(x.shape)

    def reduce(self, flat: torch.Tensor, op: str, allreduce: HostAllreduce,
               align: int = 1) -> None:
        """Reduce a contiguous 1-D int32 or float32 device tensor in place with
        `allreduce` on host chunks. align: chunk boundaries on multiples of it
        (the switch's block size, where the Worker quantizes the chunks itself,
        so that every block is whole in one call)."""
        if flat.dim() != 1 or not flat.is_contiguous() or flat.element_size() != 4:
            raise ValueError("staging reduces contiguous 1-D tensors of 4-byte elements")
        n = flat.numel()
        if n == 0:
            # An empty call still goes to the Worker (one packet with its tag):
            # a rank whose tensor is not empty gets CallMismatch, not a stall.
            allreduce(torch.empty(0, dtype=flat.dtype), op)
            self.chunks += 1
            return
        chunk = max(align, self.config.chunk_elements // align * align)
        spans = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
        words = min(chunk, 1 << (n - 1).bit_length())   # small tensors, small buffers
        ring = self._host_ring(min(self.config.buffers, len(spans)), words, flat.dtype)
        ops, slots = self.ops, len(ring)
        fetched: list = [None] * len(spans)     # chunk i is in its host buffer
        returned: list = [None] * slots         # buffer b's last copy back has been read

        def fetch(i: int) -> None:
            b, (s, e) = i % slots, spans[i]
            if returned[b] is not None:
                # the buffer's previous chunk must be on its way back first
                ops.wait(self.work, returned[b])
            ops.copy(ring[b][:e - s], flat[s:e], self.work)
            fetched[i] = ops.record(self.work)

        try:
            for i in range(slots):
                fetch(i)
            for i, (s, e) in enumerate(spans):
                host = ring[i % slots][:e - s]
                ops.synchronize(fetched[i])          # the host reads what the device copied
                allreduce(host, op)
                self.chunks += 1
                ops.wait(self.back, fetched[i])      # the device slice was read: overwrite it
                ops.copy(flat[s:e], host, self.back)
                returned[i % slots] = ops.record(self.back)
                if i + slots < len(spans):
                    fetch(i + slots)
        finally:
            # Whatever runs next on the work stream (dequantize, the caller's
            # copies, the future's events, the next call's copies into the
            # ring) comes after every copy back -- after an error too.
            ops.wait(self.work, ops.record(self.back))

    def _host_ring(self, slots: int, words: int, dtype: torch.dtype) -> list[torch.Tensor]:
        """`slots` host buffers of at least `words` 4-byte words, as `dtype`.
        Grown, never shrunk: page-locked allocations are slow, so they are kept."""
        if any(b.numel() < words for b in self._ring):
            # the previous call's copies back must be done before the old buffers go
            self.ops.synchronize(self.ops.record(self.back))
            self._ring = []
        size = max([words] + [b.numel() for b in self._ring])   # all of one size
        while len(self._ring) < slots:
            self._ring.append(self.ops.host_buffer(size))
        return [b.view(dtype) for b in self._ring[:slots]]
