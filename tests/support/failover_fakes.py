"""Fakes for the `swml` group's recovery from lost boxes
(switchml_xdp/torch/box_failover.py): parties on threads sharing a store,
and the switch and Gloo played by fakes that sum what the parties send
(tests/unit/test_box_failover.py: one rank a host; tests/unit/
test_box_failover_hosts.py: the hosts' leaders of several ranks a host)."""
from __future__ import annotations

import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch.distributed as dist

from switchml_xdp.client.boxes import BoxLost, CallInterrupted
from switchml_xdp.client.calls import CallMismatch
from switchml_xdp.torch import box_failover

WORLD = 2                   # the failover's parties
BOXES = "10.0.0.1,10.0.0.2"
WAIT_S = 10.0

WAIT_S = 10.0


class FakeJob:
    """One job on the boxes: call i's result is the sum of every rank's
    input. `fail[i] = {rank: boxes}`: that rank's call i sends, then fails
    as BoxLost (the others get the result: they are ahead), or, for a call
    in `unsent`, fails before it sends (its box gone: nobody gets the result)."""

    def __init__(self, boxes: list[str]):
        self.boxes = boxes
        self.cond = threading.Condition()
        self.inputs: dict[int, dict[int, np.ndarray]] = {}
        self.fail: dict[int, dict[int, list[str]]] = {}
        self.refused: set[int] = set()     # calls a party refused: CallMismatch on every one
        self.unsent: set[int] = set()

    def allreduce(self, rank: int, index: int, x: np.ndarray, stopped) -> None:
        with self.cond:
            lost = self.fail.get(index, {}).get(rank)
            self.inputs.setdefault(index, {})
            if not (lost and index in self.unsent):
                self.inputs[index][rank] = x.copy()
            self.cond.notify_all()
            if lost:
                e = BoxLost(f"box {lost[0]}: the box is lost", lost)
                e.lost_boxes = tuple(lost)
                raise e
            if not self.cond.wait_for(lambda: len(self.inputs[index]) == WORLD or stopped(),
                                      WAIT_S):
                raise TimeoutError(f"no result for call {index}")
            if len(self.inputs[index]) < WORLD:
                raise CallInterrupted("interrupted")
            if index in self.refused:
                raise CallMismatch(f"call {index} was refused")
            x[...] = sum(self.inputs[index].values())


class FakeWorker:
    def __init__(self, job: FakeJob, rank: int, parent: str | None = None):
        self.job, self.rank, self.calls, self.closed = job, rank, 0, False
        self._stopped = False
        self.info = types.SimpleNamespace(parent=parent)   # a rack box's job: its parent

    def allreduce(self, x: np.ndarray, op: str) -> None:
        self._stopped = False
        index, self.calls = self.calls, self.calls + 1
        self.job.allreduce(self.rank, index, x, lambda: self._stopped)

    def refuse_call(self, count: int, dtype: str = "float32", op: str = "sum") -> None:
        """The call fails on every party (CallMismatch), here expected."""
        with self.job.cond:
            self.job.refused.add(self.calls)
        try:
            self.allreduce(np.zeros(count, dtype), op)
        except CallMismatch:
            pass

    def interrupt(self, reason: str) -> None:
        self._stopped = True
        with self.job.cond:
            self.job.cond.notify_all()

    def forget(self, boxes) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeGloo:
    """Gloo's allreduce: the sum of both ranks' tensors, call by call."""

    def __init__(self, shared: dict, rank: int):
        self.shared, self.rank, self.calls = shared, rank, 0

    def allreduce(self, tensors, opts):
        index, self.calls = self.calls, self.calls + 1
        cond = self.shared["cond"]
        with cond:
            self.shared.setdefault(index, {})[self.rank] = tensors[0].numpy().copy()
            cond.notify_all()
            assert cond.wait_for(lambda: len(self.shared[index]) == WORLD, WAIT_S)
            tensors[0].numpy()[...] = sum(self.shared[index].values())
        return types.SimpleNamespace(wait=lambda timeout=None: True)

    def shutdown(self) -> None:
        pass


class Cluster:
    """The fakes both ranks share: jobs by generation, Gloo, the store."""

    def __init__(self):
        self.store = dist.HashStore()
        self.jobs: dict[int, FakeJob] = {}
        self.lock = threading.Lock()
        self.gloo = {"cond": threading.Condition()}
        self.gloo_opened = 0

    def job(self, generation: int, boxes) -> FakeJob:
        with self.lock:
            return self.jobs.setdefault(generation, FakeJob(list(boxes)))


class Rank:
    """One rank: its group (worker, rank, size), its group thread, its
    failover. hosts: the leader of host `rank` of WORLD hosts, in a group
    of `hosts` ranks, telling its host's other ranks by `tell`; `parent`:
    the parent box of its boxes (a job through a tree of boxes)."""

    parent: str | None = None

    def __init__(self, cluster: Cluster, rank: int, boxes: str = BOXES, hosts: int = 0,
                 tell=None):
        self.cluster, self._rank, self.group_size = cluster, rank, hosts or WORLD
        self.thread = ThreadPoolExecutor(max_workers=1)
        recipe = types.SimpleNamespace(options=types.SimpleNamespace(switch=boxes, control_port=1),
                                       make=self._make)
        self.worker = self._make(boxes.split(","), 0, 0)

        def gloo(store):
            cluster.gloo_opened += 1
            return FakeGloo(cluster.gloo, rank)

        self.failover = box_failover.BoxFailover(self, cluster.store, recipe, 5.0, gloo,
                                                 self.thread.submit,
                                                 party=(rank, WORLD) if hosts else None, tell=tell)

    def _make(self, boxes, join_timeout, generation=0):
        return FakeWorker(self.cluster.job(generation, boxes), self._rank, self.parent)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self.group_size

    def call(self, value: float, n: int = 8) -> np.ndarray:
        x = np.full(n, value, np.float32)
        self.thread.submit(self.failover.allreduce, x, "sum").result(WAIT_S * 3)
        return x

    def close(self) -> None:
        self.thread.shutdown(wait=True)
        self.failover.close()


def on_both(fn, cluster: Cluster | None = None, boxes: str = BOXES, make=Rank) -> list:
    cluster = cluster or Cluster()
    ranks = [make(cluster, r, boxes) for r in range(WORLD)]
    try:
        with ThreadPoolExecutor(max_workers=WORLD) as pool, warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            futures = [pool.submit(fn, r) for r in ranks]
            return [f.result(WAIT_S * 6) for f in futures]
    finally:
        for r in ranks:
            r.close()


def outcome(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - the test looks at it
        return e
