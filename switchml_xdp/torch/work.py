"""The Work that the `swml` process group hands back for a call through the switch."""
from __future__ import annotations

import datetime

import torch
import torch.distributed as dist


class FutureWork(dist.Work):
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
        return self._fut.wait()
