"""The `swml` group's recovery from lost boxes (torch/box_failover.py), with
two ranks on threads sharing a store, and the switch and Gloo played by
fakes that sum what the ranks send: the race where one rank received every
result of a call before its box died and the other did not, an idle rank
that catches up, no box left, and boxes that come back."""
from __future__ import annotations

import threading
import types
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is an optional extra")
import torch.distributed as dist  # noqa: E402 - after the importorskip

from switchml_xdp.client.boxes import BoxLost, CallInterrupted  # noqa: E402
from switchml_xdp.torch import box_failover  # noqa: E402
from switchml_xdp.torch.box_agreement import FailoverError  # noqa: E402

WORLD = 2
BOXES = "10.0.0.1,10.0.0.2"
WAIT_S = 10.0


class FakeJob:
    """One job on the boxes: call i's result is the sum of every rank's
    input. `fail[i] = {rank: boxes}`: that rank's call i sends, then fails
    as BoxLost (the others get the result: they are ahead)."""

    def __init__(self, boxes: list[str]):
        self.boxes = boxes
        self.cond = threading.Condition()
        self.inputs: dict[int, dict[int, np.ndarray]] = {}
        self.fail: dict[int, dict[int, list[str]]] = {}

    def allreduce(self, rank: int, index: int, x: np.ndarray, stopped) -> None:
        with self.cond:
            self.inputs.setdefault(index, {})[rank] = x.copy()
            self.cond.notify_all()
            lost = self.fail.get(index, {}).get(rank)
            if lost:
                e = BoxLost(f"box {lost[0]}: the box is lost", lost)
                e.lost_boxes = tuple(lost)
                raise e
            if not self.cond.wait_for(lambda: len(self.inputs[index]) == WORLD or stopped(),
                                      WAIT_S):
                raise TimeoutError(f"no result for call {index}")
            if len(self.inputs[index]) < WORLD:
                raise CallInterrupted("interrupted")
            x[...] = sum(self.inputs[index].values())


class FakeWorker:
    def __init__(self, job: FakeJob, rank: int):
        self.job, self.rank, self.calls, self.closed = job, rank, 0, False
        self._stopped = False

    def allreduce(self, x: np.ndarray, op: str) -> None:
        self._stopped = False
        index, self.calls = self.calls, self.calls + 1
        self.job.allreduce(self.rank, index, x, lambda: self._stopped)

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
    """One rank: its group (worker, rank, size), its group thread, its failover."""

    def __init__(self, cluster: Cluster, rank: int, boxes: str = BOXES):
        self.cluster, self._rank = cluster, rank
        self.thread = ThreadPoolExecutor(max_workers=1)
        recipe = types.SimpleNamespace(options=types.SimpleNamespace(switch=boxes, control_port=1),
                                       make=self._make)
        self.worker = self._make(boxes.split(","), 0, 0)

        def gloo(store):
            cluster.gloo_opened += 1
            return FakeGloo(cluster.gloo, rank)

        self.failover = box_failover.BoxFailover(self, cluster.store, recipe, 5.0, gloo,
                                                 self.thread.submit)

    def _make(self, boxes, join_timeout, generation=0):
        return FakeWorker(self.cluster.job(generation, boxes), self._rank)

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return WORLD

    def call(self, value: float, n: int = 8) -> np.ndarray:
        x = np.full(n, value, np.float32)
        self.thread.submit(self.failover.allreduce, x, "sum").result(WAIT_S * 3)
        return x

    def close(self) -> None:
        self.thread.shutdown(wait=True)
        self.failover.close()


def on_both(fn, cluster: Cluster | None = None, boxes: str = BOXES) -> list:
    cluster = cluster or Cluster()
    ranks = [Rank(cluster, r, boxes) for r in range(WORLD)]
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


@pytest.fixture(autouse=True)
def no_reaching_out(monkeypatch):
    """The watcher's look at the lost boxes' control ports: none answers."""
    monkeypatch.setattr(box_failover.BoxFailover, "_reach", lambda self, box: False)


def test_a_call_lost_everywhere_is_redone_on_the_box_left():
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.2"], 1: ["10.0.0.2"]}

    def body(r: Rank):
        return [r.call(r.rank() + 1.0)[0] for _ in range(3)], r.failover.boxes

    out = on_both(body, cluster)
    assert out[0] == out[1] == ([3.0, 3.0, 3.0], ["10.0.0.1"])
    assert cluster.jobs[1].boxes == ["10.0.0.1"]
    assert sorted(cluster.jobs[1].inputs) == [0, 1]         # call 1 redone, then call 2


def test_a_rank_that_had_the_result_redoes_the_call_with_the_others():
    """Rank 0 received every result of call 1 before the box died, rank 1
    did not: rank 0's call 2 is interrupted; both redo call 1 (rank 0 from
    the input it kept, dropping the same result), then call 2."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.2"]}

    def body(r: Rank):
        return [r.call(10.0 * step + r.rank())[0] for step in range(4)]

    out = on_both(body, cluster)
    assert out[0] == out[1] == [1.0, 21.0, 41.0, 61.0]
    redo = cluster.jobs[1].inputs
    assert [redo[0][r][0] for r in range(WORLD)] == [10.0, 11.0]   # call 1's inputs, both ranks


def test_an_idle_rank_that_had_the_result_catches_up():
    """Rank 0 completed its last call before the box died and calls no
    more: its watcher joins it to the agreement and the redo."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.2"]}

    def body(r: Rank):
        out = [r.call(10.0 * step + r.rank())[0] for step in range(2)]
        if r.rank() == 0:
            done = threading.Event()
            while r.failover.generation == 0 and not done.wait(0.05):
                pass
        return out

    assert on_both(body, cluster) == [[1.0, 21.0], [1.0, 21.0]]


def test_with_no_box_left_the_calls_go_to_gloo():
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.1"], 1: ["10.0.0.1"]}

    def body(r: Rank):
        return [r.call(r.rank() + 1.0)[0] for _ in range(3)], r.worker, r.failover.boxes

    out = on_both(body, cluster, boxes="10.0.0.1")
    assert out[0] == out[1] == ([3.0, 3.0, 3.0], None, [])
    assert cluster.gloo_opened == WORLD


def test_with_no_box_left_a_call_one_rank_had_is_an_error_on_every_rank():
    """Gloo's sum would not be the switch's that rank 0 handed on already."""
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {1: ["10.0.0.1"]}

    def body(r: Rank):
        return [outcome(lambda: r.call(1.0)[0]) for _ in range(3 - r.rank())]

    out = on_both(body, cluster, boxes="10.0.0.1")
    assert out[0][:2] == [2.0, 2.0] and out[1][0] == 2.0
    for r, e in ((0, out[0][2]), (1, out[1][1])):
        assert isinstance(e, FailoverError) and "no box is left to redo it exactly" in str(e), (r, e)


def test_lost_boxes_that_every_rank_reaches_come_back_at_a_call_boundary(monkeypatch):
    monkeypatch.setenv("SWML_BOX_RETRY_CALLS", "4")
    monkeypatch.setattr(box_failover, "REACH_EVERY_S", 0.05)
    cluster = Cluster()
    cluster.job(0, []).fail[1] = {0: ["10.0.0.2"], 1: ["10.0.0.2"]}
    back = threading.Event()
    monkeypatch.setattr(box_failover.BoxFailover, "_reach", lambda self, box: back.is_set())

    def body(r: Rank):
        seen = []
        for step in range(9):
            if step == 2:
                back.set()
                threading.Event().wait(0.3)     # both watchers reach it
            r.call(1.0)
            seen.append(len(r.failover.boxes))
        return seen

    out = on_both(body, cluster)
    assert out[0] == out[1] == [2, 1, 1, 1, 2, 2, 2, 2, 2]   # back before call 4, on both
    assert cluster.jobs[2].boxes == ["10.0.0.1", "10.0.0.2"]


def test_a_box_is_back_only_by_a_try_that_began_after_it_was_lost():
    """A try that reached the box before it was lost says nothing of now."""
    r = Rank(Cluster(), 0)
    try:
        f = r.failover
        f._stop.set()       # no watcher's try meanwhile
        f._watcher.join()
        f._probes["10.0.0.1"] = (f._lost_at.get("10.0.0.1", 0.0) - 1.0, True)   # while it served
        f._set_boxes(["10.0.0.2"])
        assert f._reached() == []
        f._probes["10.0.0.1"] = (f._lost_at["10.0.0.1"] + 0.001, True)
        assert f._reached() == ["10.0.0.1"]
        f._probes["10.0.0.1"] = (f._lost_at["10.0.0.1"] + 0.002, False)
        assert f._reached() == []
        f._set_boxes(["10.0.0.1", "10.0.0.2"])
        assert "10.0.0.1" not in f._lost_at
    finally:
        r.close()
