"""A lost box (client/box_watch.py; docs/scale-out.md, "Failures"): in a lab
of two boxes, a job streams calls through both; box 1's link goes down, or
its daemon is killed with its data plane, in the middle of a call. Every
rank's call fails within 2 s of that, as BoxLost naming box 1, with the
stall timeout left at its 30 s default; a daemon that stops cleanly fails
it at once (the job aborted there), naming the box."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

K = 256
NOTICED_S = 2.0     # the default box_timeout: the bound on every rank


@pytest.fixture(scope="module")
def lab(two_box_lab):
    return two_box_lab


def link(lab, box: int, state: str) -> None:
    host = lab.switches[box]
    lab.run(host, ["ip", "link", "set", "dev", host.iface, state])


def lose_box_1_mid_call(lab, job: str, lose) -> list:
    """Both ranks stream calls through both boxes until one fails; `lose()`
    runs once they are streaming. Returns each rank's (error, seconds from
    lose() to the error)."""
    from switchml_xdp import Worker

    addresses = [b.ip for b in lab.switches]
    streaming = threading.Barrier(3)
    lost_at = {}

    def body(rank, host):
        with Worker(addresses, job, rank, 2, backend="udp", verbose=False) as w:
            x = np.ones(200 * K, np.float32)
            w.allreduce(x)
            streaming.wait(30)
            while True:
                try:
                    w.allreduce(x)
                except Exception as e:  # noqa: BLE001 - the test looks at it
                    return e, time.monotonic() - lost_at["t"]

    def loser():
        streaming.wait(30)
        time.sleep(0.5)
        lost_at["t"] = time.monotonic()
        lose()

    return run_ranks(lab, lab.workers[:2], body, timeout=60, beside=loser)


def check_lost(lab, out) -> None:
    from switchml_xdp.client.boxes import BoxLost

    box1 = lab.switches[1].ip
    for rank, (error, seconds) in enumerate(out):
        assert isinstance(error, BoxLost) and isinstance(error, TimeoutError), (rank, repr(error))
        assert str(error).startswith(f"box {box1}: ") and error.boxes == (box1,), (rank, error)
        assert seconds < NOTICED_S, (rank, seconds)
        print(f"[box lost] rank {rank}: {type(error).__name__} {seconds * 1000:.0f} ms after: {error}")


def test_a_box_whose_link_goes_down_fails_every_ranks_call_within_2_s(lab):
    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1):
        try:
            out = lose_box_1_mid_call(lab, "link-down", lambda: link(lab, 1, "down"))
        finally:
            link(lab, 1, "up")
    check_lost(lab, out)


def test_a_box_killed_with_its_data_plane_fails_every_ranks_call_within_2_s(lab):
    """SIGKILL: no word to the workers; then its data plane goes too (the
    pins a killed daemon leaves for its restart are removed), as on a box
    that is powered off."""
    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1) as sw1:
        def kill():
            sw1.proc.kill()
            host = lab.switches[1]
            lab.run(host, ["ip", "link", "set", "dev", host.iface, "xdp", "off"])
            sw1.proc.wait()
            sw1.stop()      # its leftovers: the pins
        out = lose_box_1_mid_call(lab, "killed", kill)
    check_lost(lab, out)


def test_a_box_stopped_cleanly_fails_every_ranks_call_at_once_naming_it(lab):
    """A daemon that stops says so: the job is aborted there (JobAborted),
    and the error lists the box among the call's lost boxes."""
    from switchml_xdp.client.abort import JobAborted
    from switchml_xdp.client.boxes import lost_boxes

    box1 = lab.switches[1].ip
    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1) as sw1:
        out = lose_box_1_mid_call(lab, "stopped", sw1.stop)
    for rank, (error, seconds) in enumerate(out):
        assert isinstance(error, JobAborted) and str(error).startswith(f"box {box1}: "), repr(error)
        assert lost_boxes(error) == (box1,) and seconds < NOTICED_S, (rank, seconds)


def test_a_box_stopped_while_the_peer_is_between_calls_fails_the_call_at_once(lab):
    """Rank 0 is inside a call when box 1's daemon stops; rank 1 has not begun
    it and hears of the stop first, so it never streams its part through box
    0 (its call fails at once: the test below). Rank 0's part on box 0 would
    wait for it until the stall timeout (seen in CI: 30 s, then a TimeoutError
    naming box 0); the job's abort on box 1 stops the call's parts on every
    box, and the error names box 1."""
    from switchml_xdp import Worker
    from switchml_xdp.client.abort import JobAborted
    from switchml_xdp.client.boxes import lost_boxes

    box1 = lab.switches[1].ip
    stall_s = 20.0
    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1) as sw1:
        streamed, stopped = threading.Barrier(3), threading.Event()
        stopped_at = {}

        def body(rank, host):
            with Worker([b.ip for b in lab.switches], "stopped-peer-idle", rank, 2,
                        backend="udp", verbose=False, stall_timeout=stall_s) as w:
                x = np.ones(50 * K, np.float32)
                w.allreduce(x)
                streamed.wait(30)
                if rank == 1:
                    stopped.wait(30)      # begins its call only after the stop
                try:
                    w.allreduce(x)
                except Exception as e:  # noqa: BLE001 - the test looks at it
                    return e, time.monotonic() - stopped_at["t"]
                return None, 0.0

        def stopper():
            streamed.wait(30)
            time.sleep(0.5)               # rank 0 inside its call, waiting for rank 1
            stopped_at["t"] = time.monotonic()
            sw1.stop()
            stopped.set()

        out = run_ranks(lab, lab.workers[:2], body, timeout=60, beside=stopper)
    for rank, (error, seconds) in enumerate(out):
        assert isinstance(error, JobAborted) and str(error).startswith(f"box {box1}: "), (
            rank, repr(error))
        assert lost_boxes(error) == (box1,) and seconds < NOTICED_S, (rank, seconds)


def test_a_call_after_a_box_stopped_names_it_among_the_lost_boxes(lab):
    """The abort came between two calls: the next call fails at once, before
    anything streams, as JobAborted naming the box, which the error lists
    among its lost boxes (seen in CI as the race of the test above)."""
    from switchml_xdp import Worker
    from switchml_xdp.client.abort import JobAborted
    from switchml_xdp.client.boxes import lost_boxes

    box1 = lab.switches[1].ip
    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1) as sw1:
        stopped = threading.Barrier(2)

        def body(rank, host):
            with Worker([b.ip for b in lab.switches], "stopped-between", rank, 2, backend="udp",
                        verbose=False) as w:
                x = np.ones(50 * K, np.float32)
                w.allreduce(x)
                if rank == 0:
                    sw1.stop()
                stopped.wait(30)
                deadline = time.monotonic() + 10
                while w._boxes[1].control.abort.reason is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                try:
                    w.allreduce(x)
                except JobAborted as e:
                    return str(e), lost_boxes(e)
                return "no error", ()

        out = run_ranks(lab, lab.workers[:2], body, timeout=60)
    for message, lost in out:
        assert message.startswith(f"box {box1}: ") and lost == (box1,), (message, lost)


def test_an_interrupted_call_fails_on_every_datapath_and_the_next_is_right(lab):
    """Worker.interrupt (the torch backend's, when another rank lost a box)
    stops the call in the AF_XDP engine's C loop too, for that call only."""
    from switchml_xdp import Worker
    from switchml_xdp.client.afxdp_backend import unavailable_reason
    from switchml_xdp.client.boxes import CallInterrupted

    if unavailable_reason():
        pytest.skip(f"AF_XDP: {unavailable_reason()}")
    addresses = [b.ip for b in lab.switches]

    def body(rank, host):
        with Worker(addresses, "interrupted", rank, 2, backend=("afxdp", "udp")[rank],
                    verbose=False) as w:
            big = np.ones(16_000_000, np.float32)
            threading.Timer(0.3, w.interrupt, ["the test stops it"]).start()
            try:
                w.allreduce(big)
                stopped = None
            except CallInterrupted as e:
                stopped = str(e)
            x = np.full(100 * K, rank + 1, np.int32)
            w.allreduce(x)
            return stopped, bool((x == 3).all())

    with SwitchProcess(lab, box=0), SwitchProcess(lab, box=1):
        out = run_ranks(lab, lab.workers[:2], body, timeout=60)
    for rank, (stopped, right) in enumerate(out):
        assert stopped == "the test stops it", (rank, stopped)
        assert right, rank
