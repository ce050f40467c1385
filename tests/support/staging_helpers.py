"""Stand-ins for the staging pipeline's tests (tests/test_staging.py): a switch
for ranks run as threads, and device operations whose copies run late."""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import numpy as np
import torch

from switchml_xdp import quant16
from switchml_xdp.torch.staging import CpuOps


class LockstepSwitch:
    """An exact allreduce for `world` ranks run as threads: each call returns
    once every rank has made it, with the switch's result (int32 SUM wraps;
    MIN/MAX exact; a float32 SUM at precision "16" as quant16 simulates it).
    Ranks whose i-th calls differ raise AssertionError, as the Worker raises
    CallMismatch."""

    def __init__(self, world: int, k: int = 256):
        self.world, self.k = world, k
        self._barrier = threading.Barrier(world, timeout=60)
        self._calls: list[list] = [[] for _ in range(world)]
        self.ops_seen: list[tuple[str, str, int]] = []       # rank 0's (op, dtype, length)

    def endpoint(self, rank: int, precision: str = "32") -> Callable[[torch.Tensor, str], None]:
        def allreduce(t: torch.Tensor, op: str) -> None:
            assert t.device.type == "cpu" and t.dim() == 1 and t.is_contiguous()
            i = len(self._calls[rank])
            self._calls[rank].append((op, precision, t.clone()))
            if rank == 0:
                self.ops_seen.append((op, str(t.dtype), t.numel()))
            self._barrier.wait()
            calls = [self._calls[r][i] for r in range(self.world)]
            kinds = {(o, p, c.dtype, c.numel()) for o, p, c in calls}
            assert len(kinds) == 1, f"call {i} differs between the ranks: {kinds}"
            t.copy_(self._result(op, precision, [c for _, _, c in calls]))
            self._barrier.wait()
        return allreduce

    def _result(self, op: str, precision: str, parts: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(parts)
        if op == "max":
            return stacked.amax(0)
        if op == "min":
            return stacked.amin(0)
        if parts[0].dtype == torch.int32:
            wide = stacked.to(torch.int64).sum(0)
            return ((wide + 2**31) % 2**32 - 2**31).to(torch.int32)
        assert precision == "16", "float32 sums reach the Worker only at precision 16"
        return torch.from_numpy(quant16.simulate_allreduce16([p.numpy() for p in parts], self.k))


def run_ranks(world: int, body: Callable[[int], object]) -> list:
    """body(rank) on `world` threads at once; their results in rank order
    (the first exception re-raised)."""
    out: list = [None] * world
    errors: list = []

    def run(r: int) -> None:
        try:
            out[r] = body(r)
        except BaseException as e:  # noqa: BLE001 - handed to the caller, which re-raises it
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


class _Stream:
    def __init__(self, name: str):
        self.name = name
        self.queue: list[Callable[[], None]] = []   # copies not run yet
        self.ran = 0                                # how many of them have run


class _Event:
    def __init__(self, stream: _Stream):
        self.stream, self.position = stream, len(stream.queue)


class DeferredCopies(CpuOps):
    """CpuOps whose copies run as late as a GPU may run them: a copy waits in
    its stream's queue until an event after it is synchronized or waited for.
    (Torch ops run at once: they stand for the pipeline's own stream, whose
    copies it must wait for before using their results.) A pipeline missing
    a wait or a synchronize reads stale data and gets the wrong bits."""

    def __init__(self):
        super().__init__()
        self.caller = _Stream("caller")
        self._current = self.caller
        self.streams = [self.caller]

    def new_stream(self):
        stream = _Stream(f"side{len(self.streams)}")
        self.streams.append(stream)
        return stream

    def current_stream(self):
        return self._current

    @contextlib.contextmanager
    def use_stream(self, stream):
        previous, self._current = self._current, stream
        try:
            yield
        finally:
            self._current = previous

    def record(self, stream):
        return _Event(stream)

    def wait(self, stream, event) -> None:
        self._run_until(event)

    def synchronize(self, event) -> None:
        self._run_until(event)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream) -> None:
        stream.queue.append(lambda: dst.copy_(src))    # reads src when it runs

    @staticmethod
    def _run_until(event: _Event) -> None:
        stream = event.stream
        while stream.ran < event.position:
            stream.queue[stream.ran]()
            stream.ran += 1

    def pending(self) -> dict[str, int]:
        return {s.name: len(s.queue) - s.ran for s in self.streams if len(s.queue) > s.ran}


def random_floats(seed: int, n: int, span: int = 20) -> np.ndarray:
    """float32 values over 2 * span binades, zeros of both signs. span=10
    keeps them inside float16's range (its subnormals included): at the
    default, float16 would round a tenth of them to inf, and every block
    to NaN."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-span, span, n)).astype(np.float32)
    x[::97] = 0.0
    x[5::131] = -0.0
    return x
