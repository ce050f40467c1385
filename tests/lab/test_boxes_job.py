"""A job over several boxes (client/boxes.py; docs/scale-out.md): in a lab
of two boxes, an XDP switch on one and the user-space data plane on the
other, told different capacities, every tensor's blocks go 1:2 to the boxes
and the results are those of one box, bit for bit; ranks that list different
boxes are refused at join, every rank; a box that stops answering fails the
call on every rank, naming the box."""
from __future__ import annotations

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from lab_jobs import xdp_and_userspace_boxes
from switchml_xdp import quant
from switchml_xdp.client.boxes import split
from switchml_xdp.lab.cluster import run_ranks

K = 256
CAPACITIES = ("100M", "200M")          # box 0 (XDP), box 1 (user space)
BACKENDS = ("afxdp", "udp")


@pytest.fixture(scope="module")
def lab(two_box_lab):
    return two_box_lab


@pytest.fixture(scope="module")
def boxes(lab):
    with xdp_and_userspace_boxes(lab, ["--capacity", CAPACITIES[0]],
                                 ["--capacity", CAPACITIES[1]]) as both:
        yield both


def on_every_rank(lab, body, backends=BACKENDS, timeout=120.0):
    return run_ranks(lab, lab.workers[:len(backends)], body, timeout=timeout)


def test_a_job_over_two_boxes_splits_by_capacity_and_equals_one_box(lab, boxes):
    from switchml_xdp import Worker

    addresses = [b.ip for b in lab.switches]
    n = 100 * K + 17
    xs = [np.random.default_rng([5, r]).standard_normal(n).astype(np.float32)
          * np.float32(10.0) ** np.random.default_rng([6, r]).integers(-8, 8, n).astype(np.float32)
          for r in range(2)]
    ints = [np.random.default_rng([7, r]).integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
            for r in range(2)]

    def body(rank, host):
        with Worker(addresses, "two-boxes", rank, 2, backend=BACKENDS[rank], verbose=False,
                    stall_timeout=30) as w:
            f, i = xs[rank].copy(), ints[rank].copy()
            w.allreduce(f)
            w.allreduce(i)
            return f, i, w.stats(), [b.info.capacity_bps for b in w._boxes]

    out = on_every_rank(lab, body)
    want_f = quant.simulate_allreduce(xs, K)
    want_i = (ints[0].astype(np.int64) + ints[1]).astype(np.uint32).view(np.int32)
    for rank, (f, i, stats, caps) in enumerate(out):
        assert caps == [100 * 10**6, 200 * 10**6]
        assert np.array_equal(f.view(np.uint32), want_f.view(np.uint32)), rank   # as one box
        assert np.array_equal(i, want_i), rank
        per_box = stats["boxes"]
        assert [b["box"] for b in per_box] == addresses
        assert split(n, K, caps) == [(0, 34 * K), (34 * K, n)]   # 101 blocks: 34 and 67
        sent = [b["packets_sent"] - b["retransmissions"] for b in per_box]
        assert sent[0] > 0 and sent[1] > 0 and 1.7 < sent[1] / sent[0] < 2.3, per_box


def test_ranks_that_list_different_boxes_are_refused_at_join(lab, boxes):
    from switchml_xdp import Worker
    from switchml_xdp.client.control import ControlError

    addresses = [b.ip for b in lab.switches]
    lists = [addresses, [addresses[0]]]      # rank 1 forgot box 1

    def body(rank, host):
        try:
            Worker(lists[rank], "disagree", rank, 2, backend="udp", verbose=False,
                   join_timeout=5).close()
        except ControlError as e:
            return str(e)
        return None

    errors = on_every_rank(lab, body, ("udp", "udp"))
    # The first rank at box 0 sets the job's list; the other is refused there,
    # and the first's join then fails too (it times out waiting for it).
    assert all(errors), errors
    assert any("list different boxes" in e for e in errors), errors


def test_a_silent_box_fails_the_call_naming_it_and_is_used_again_when_it_answers(lab, boxes):
    """Every frame to and from box 1 lost (a link down): the call fails on
    every rank within the stall timeout, naming the box; with the link back,
    the next call is right on every rank."""
    import time

    from switchml_xdp import Worker

    addresses = [b.ip for b in lab.switches]
    phase = {"silent": False}

    def body(rank, host):
        with Worker(addresses, "silent-box", rank, 2, backend=BACKENDS[rank], verbose=False,
                    stall_timeout=2) as w:
            w.allreduce(np.ones(50 * K, np.float32))
            while not phase["silent"]:
                time.sleep(0.01)
            t0 = time.monotonic()
            try:
                w.allreduce(np.ones(50 * K, np.float32))
                failed = None
            except TimeoutError as e:
                failed = (str(e), time.monotonic() - t0)
            while phase["silent"]:
                time.sleep(0.01)
            x = np.full(50 * K, rank + 1, np.int32)
            w.allreduce(x)
            return failed, bool((x == 3).all())

    import threading

    def link_down_then_up():
        time.sleep(1.0)
        lab.set_loss(1.0, hosts=["sw1"])
        phase["silent"] = True
        time.sleep(5.0)
        lab.set_loss(0.0, hosts=["sw1"])
        phase["silent"] = False

    t = threading.Thread(target=link_down_then_up)
    t.start()
    try:
        out = on_every_rank(lab, body)
    finally:
        t.join()
        lab.set_loss(0.0, hosts=["sw1"])
    for rank, (failed, right_after) in enumerate(out):
        assert failed is not None, f"rank {rank}: the call went through without box 1"
        message, seconds = failed
        assert message.startswith(f"box {addresses[1]}: ") and seconds < 4, (rank, failed)
        assert right_after, rank


def test_a_box_that_stops_answering_fails_the_call_naming_it(lab, boxes):
    from switchml_xdp import Worker

    addresses = [b.ip for b in lab.switches]
    _, userspace = boxes
    killed = []

    def body(rank, host):
        with Worker(addresses, "lost-box", rank, 2, backend="udp", verbose=False,
                    stall_timeout=2) as w:
            x = np.ones(50 * K, np.float32)
            w.allreduce(x)
            if rank == 0:
                userspace.stop()
                killed.append(True)
            while not killed:
                pass
            try:
                w.allreduce(np.ones(50 * K, np.float32))
            except Exception as e:  # noqa: BLE001 - the failure is what is checked
                return type(e).__name__, str(e)
            return None

    out = on_every_rank(lab, body, ("udp", "udp"))
    for rank, got in enumerate(out):
        assert got is not None, f"rank {rank}: the call went through without box 1"
        assert lab.switches[1].ip in got[1], (rank, got)
