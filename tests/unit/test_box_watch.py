"""A lost box noticed within box_timeout (client/box_watch.py, boxes.py):
boxes whose data path is played by a fake backend and whose control
connection by a fake client that answers heartbeats, or not."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from switchml_xdp.client.abort import AbortSignal, JobAborted
from switchml_xdp.client.box_watch import BoxSignal
from switchml_xdp.client.boxes import Box, BoxLost, BoxSplit, CallInterrupted, lost_boxes
from switchml_xdp.client.calls import Call

BOX_TIMEOUT = 0.4


class FakeControl:
    """Answers each ping at once while `alive`."""

    def __init__(self, alive: bool = True):
        self.alive, self.pongs, self.pings = alive, 0, 0
        self.abort = AbortSignal()

    def ping(self) -> bool:
        self.pings += 1
        if self.alive:
            self.pongs += 1
        return True


class FakeBackend:
    """A part that takes `seconds`, with a result every 10 ms while
    `flowing`; without results it fails as a stall after `stall` s."""

    def __init__(self, signal: BoxSignal, seconds: float = 0.1, flowing: bool = True,
                 stall: float = 30.0, astray: str | None = None):
        self.signal, self.seconds, self.flowing, self.stall = signal, seconds, flowing, stall
        self.astray = astray     # what misroute_check says (afxdp: RESULTs on another queue)
        self.results = 0

    def stats(self) -> dict:
        return {"results": self.results}

    def misroute_check(self):
        return lambda: self.astray

    def allreduce(self, part: np.ndarray, call: Call) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < self.seconds:
            self.signal.raise_if_set("j")
            if self.flowing:
                self.results += 1
            elif time.monotonic() - t0 > self.stall:
                raise TimeoutError(f"no result from the switch for {self.stall:g} s")
            time.sleep(0.01)
        part += 1


def box(address: str, **backend) -> Box:
    control = FakeControl(backend.pop("alive", True))
    signal = BoxSignal(control.abort)
    info = type("Info", (), {"k": 4, "capacity_bps": None})()
    return Box(address, control, info, FakeBackend(signal, **backend), signal)


def reduce(boxes: list[Box], n: int = 64) -> tuple[float, BaseException | None]:
    split = BoxSplit(boxes, BOX_TIMEOUT)
    t0 = time.monotonic()
    try:
        split.begin()
        split.reduce(np.zeros(n, np.float32), Call(0, "j", n, "float32", "sum"))
        return time.monotonic() - t0, None
    except BaseException as e:  # noqa: BLE001 - the test looks at it
        return time.monotonic() - t0, e
    finally:
        split.close()


def test_boxes_that_answer_are_not_asked():
    boxes = [box("10.0.0.1"), box("10.0.0.2")]
    took, error = reduce(boxes)
    assert error is None
    assert [b.control.pings for b in boxes] == [0, 0]


def test_a_silent_box_that_does_not_answer_is_lost_within_the_box_timeout():
    boxes = [box("10.0.0.1"), box("10.0.0.2", seconds=60, flowing=False, alive=False)]
    took, error = reduce(boxes)
    assert isinstance(error, BoxLost) and isinstance(error, TimeoutError)
    assert str(error).startswith("box 10.0.0.2: no result for ") and "the box is lost" in str(error)
    assert error.boxes == ("10.0.0.2",) == lost_boxes(error)
    assert 0.8 * BOX_TIMEOUT <= took < BOX_TIMEOUT + 0.2, took
    assert boxes[1].lost and not boxes[0].lost


def test_one_box_is_watched_too():
    took, error = reduce([box("10.0.0.1", seconds=60, flowing=False, alive=False)])
    assert isinstance(error, BoxLost) and took < BOX_TIMEOUT + 0.2
    assert str(error).startswith("box 10.0.0.1: ")


def test_a_silent_box_that_answers_is_waited_for_as_a_slow_peer():
    """No result, but its control connection answers: the stall timeout
    decides, as today (a slow peer rank looks the same on the data path)."""
    boxes = [box("10.0.0.1"), box("10.0.0.2", seconds=60, flowing=False, stall=1.5)]
    took, error = reduce(boxes)
    assert not isinstance(error, BoxLost), error
    assert isinstance(error, TimeoutError) and str(error).startswith("box 10.0.0.2: no result")
    assert took >= 1.5 and boxes[1].control.pings >= 2     # asked again after each answer
    assert lost_boxes(error) == ()


@pytest.mark.parametrize("n_boxes", [1, 2])
def test_a_part_whose_results_go_astray_fails_at_the_ask_not_the_stall_timeout(n_boxes):
    """Its box answers (alive), but its datapath saw the call's RESULTs
    reach the host and go elsewhere (afxdp: another lane's queue): waiting
    cannot help, so the call fails as a stall would, at once, saying why."""
    why = "3 RESULT(s) came in on the wrong receive queue of eth1"
    astray = box("10.0.0.2", seconds=60, flowing=False, stall=30.0, astray=why)
    boxes = [box("10.0.0.1"), astray][2 - n_boxes:]
    took, error = reduce(boxes)
    assert isinstance(error, TimeoutError) and not isinstance(error, BoxLost), error
    prefix = "box 10.0.0.2: " if n_boxes == 2 else ""
    assert str(error).startswith(f"{prefix}no result for ") and str(error).endswith(f", and {why}")
    assert 0.4 * BOX_TIMEOUT <= took < 0.4 * BOX_TIMEOUT + 0.3, took
    assert lost_boxes(error) == () and not astray.lost     # alive: its leave is sent


def test_a_slow_box_with_results_is_never_lost():
    took, error = reduce([box("10.0.0.1", seconds=1.2, alive=False), box("10.0.0.2")])
    assert error is None and took >= 1.2


def test_a_lost_box_is_asked_again_at_the_next_call():
    """The interrupt is for one call: the next call uses the box again."""
    silent = box("10.0.0.2", seconds=60, flowing=False, alive=False)
    boxes = [box("10.0.0.1"), silent]
    split = BoxSplit(boxes, BOX_TIMEOUT)
    call = Call(0, "j", 64, "float32", "sum")
    try:
        split.begin()
        with pytest.raises(BoxLost):
            split.reduce(np.zeros(64, np.float32), call)
        silent.backend.seconds, silent.backend.flowing = 0.1, True
        split.begin()
        x = np.zeros(64, np.float32)
        split.reduce(x, call)
        assert (x == 1).all()
    finally:
        split.close()


def test_a_job_aborted_on_a_box_stays_aborted_and_is_named_lost():
    b = box("10.0.0.2")
    b.control.abort.set("the switch is going down")
    b.signal.clear()
    assert b.signal.for_good and b.signal.reason == "the switch is going down"
    took, error = reduce([box("10.0.0.1"), b])
    assert isinstance(error, JobAborted) and lost_boxes(error) == ("10.0.0.2",)


def test_an_interrupt_stops_the_call_and_says_why():
    boxes = [box("10.0.0.1", seconds=60), box("10.0.0.2", seconds=60)]
    split = BoxSplit(boxes, BOX_TIMEOUT)
    try:
        split.begin()
        threading.Timer(0.2, split.interrupt, ["rank 1 lost box 10.0.0.2 at call 7"]).start()
        with pytest.raises(CallInterrupted, match="rank 1 lost box 10.0.0.2 at call 7"):
            split.reduce(np.zeros(64, np.float32), Call(0, "j", 64, "float32", "sum"))
    finally:
        split.close()


def test_an_interrupt_does_not_outlive_its_call_but_the_jobs_abort_does():
    job = AbortSignal()
    signal = BoxSignal(job)
    signal.interrupt("one call")
    assert signal.reason == "one call"
    signal.clear()
    assert signal.reason is None and not signal.for_good
    signal.interrupt("one call")
    job.set("aborted by the switch")
    signal.clear()
    assert signal.reason == "aborted by the switch" and signal.for_good
