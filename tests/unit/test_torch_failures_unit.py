"""The `swml` backend's failure semantics without a lab (docs/pytorch.md,
"When a call fails"): a Work that waits at most the group's timeout and names
its call, a refused call's tag that matches no call, and barrier's Gloo side
that waits for collectives only, never for a send or a receive."""
from __future__ import annotations

import datetime
import threading
import time

import pytest

from switchml_xdp.client.calls import Call

torch = pytest.importorskip(
    "torch", reason="PyTorch is an optional extra: pip install -e '.[torch]' (torch==2.13.0)")

from switchml_xdp.torch import gloo_side  # noqa: E402 - after the importorskip
from switchml_xdp.torch.work import FutureWork, SwmlCallError, call_failed  # noqa: E402


def test_a_refused_call_matches_no_call():
    real = Call(3, "j", 100, "float32", "sum")
    refused = Call(3, "j", 100, "float32", "sum", refused=True)
    assert refused.tag != real.tag
    for op in ("sum", "min", "max"):
        for dtype in ("float32", "int32"):
            assert Call(3, "j", 100, dtype, op, refused=True).tag != Call(3, "j", 100, dtype, op).tag


def test_a_work_that_never_completes_raises_within_the_group_timeout():
    work = FutureWork(torch.futures.Future(), "all_reduce #4 on rank 1",
                      datetime.timedelta(seconds=0.3))
    t0 = time.monotonic()
    with pytest.raises(SwmlCallError, match=r"all_reduce #4 on rank 1: no result within 0.3 s"):
        work.wait()
    assert time.monotonic() - t0 < 2.0
    with pytest.raises(SwmlCallError, match="within 0.1 s"):
        work.wait(datetime.timedelta(seconds=0.1))      # the caller's own timeout wins


def test_a_failed_call_names_itself_and_keeps_its_cause():
    fut = torch.futures.Future()
    cause = RuntimeError("the ranks disagree")
    fut.set_exception(call_failed("barrier #2 on rank 0", cause))
    work = FutureWork(fut, "barrier #2 on rank 0", datetime.timedelta(seconds=5))
    with pytest.raises(SwmlCallError, match=r"swml barrier #2 on rank 0 failed: RuntimeError: "
                                            r"the ranks disagree") as info:
        work.wait()
    assert info.value.__cause__ is cause
    assert work.is_completed() and not work.is_success()


def test_a_completed_work_returns_at_once():
    fut = torch.futures.Future()
    fut.set_result([])
    assert FutureWork(fut, "all_reduce #1", datetime.timedelta(seconds=5)).wait()


class _Work:
    def __init__(self):
        self.waits = []

    def is_completed(self):
        return False

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return True


class _Gloo:
    def __getattr__(self, name):
        return lambda *a, **k: _Work()


class _Calls:
    debug = False

    def through_gloo(self, name):
        return False


class _Side(gloo_side.GlooSide):
    def __init__(self):
        self.gloo, self.calls = _Gloo(), _Calls()
        self.group_timeout = datetime.timedelta(seconds=7)
        self._gloo_pending, self._gloo_lock = [], threading.Lock()


def test_barrier_waits_for_gloo_collectives_not_for_sends_and_receives():
    side = _Side()
    side.send([], 1, 0)
    side.recv([], 0, 0)
    side.recv_anysource([], 0)
    gathered = side.allgather([], [])
    scattered = side.reduce_scatter([], [])
    issued = side._gloo_issued()
    assert issued == [gathered, scattered]
    side._wait_for_gloo(issued)
    assert gathered.waits == [datetime.timedelta(seconds=7)]      # bounded by the group's timeout
