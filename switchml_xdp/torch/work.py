"""The Work that the `swml` process group hands back for a call through the
switch, and the error it raises when the call fails (docs/pytorch.md, "When a
call fails")."""
from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist


class SwmlCallError(RuntimeError):
    """A call of the `swml` process group failed on this rank, or gave no
    result within the group's timeout; the message names the call and why
    (the error that failed it is its __cause__)."""


def call_failed(call: str, error: BaseException) -> SwmlCallError:
    """The error `call` (e.g. "all_reduce #7 on rank 3") raises for `error`."""
    failed = SwmlCallError(f"swml {call} failed: {type(error).__name__}: {error}")
    failed.__cause__ = error
    return failed


def _seconds(timeout: datetime.timedelta | float | None) -> float | None:
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return timeout or None     # torch's "no timeout" is 0


class FutureWork(dist.Work):
    """A Work completed through a torch future (set from the group's thread).

    For CUDA tensors the future is CUDA-aware (staging.CudaOps.future): wait()
    and result() return once the host side is done, having made the
    caller's current stream wait for the device side -- ProcessGroupNCCL's
    Work.wait(), which blocks the stream rather than the host.

    wait() waits at most its timeout, else the group's (`timeout`), and then
    raises SwmlCallError naming the call (`call`)."""

    def __init__(self, fut: torch.futures.Future, call: str = "call",
                 timeout: datetime.timedelta | None = None):
        super().__init__()
        self._fut = fut
        self._call = call
        self._timeout_s = _seconds(timeout)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        limit = _seconds(timeout) or self._timeout_s
        if limit is not None and not self._fut.done():
            done = threading.Event()
            self._fut.add_done_callback(lambda _: done.set())
            if not done.wait(limit):
                raise SwmlCallError(f"swml {self._call}: no result within {limit:g} s "
                                    "(the process group's timeout)")
        self._fut.wait()  # re-raises the call's error, if any
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        return self._fut.done() and self.exception() is None

    def exception(self) -> BaseException | None:
        """The call's error, None while it runs or once it has succeeded."""
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as e:  # noqa: BLE001 - the call's error, of whatever type, is the answer
            return e
        return None

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._fut.wait()
