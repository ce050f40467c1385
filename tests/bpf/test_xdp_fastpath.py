"""The switch program's fast paths (docs/performance.md) on crafted frames
through BPF_PROG_TEST_RUN: the slot's lock word, the 64-bit copies of the
payload (odd k: a last int32 alone; the int32 edges), as test_xdp_switch_prog.py
tests the rules. The user-space data plane compiles the same xdp/swml_slot.h."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import wire
from xdp_tester import Action, Run, SwitchTester, assert_accounted, only, require_bpf

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
EDGES = np.array([INT32_MIN, INT32_MAX, -1, 0, 1, INT32_MIN + 1, INT32_MAX - 1], np.int32)


@pytest.fixture(scope="module", params=[1, 7, 8])
def switch_prog(request):
    """k=1 and 7: the copies' odd last element; 8: pairs only."""
    require_bpf()
    with SwitchTester(k=request.param, slots=4) as sw:
        yield sw


def values(k: int, seed: int) -> np.ndarray:
    """k int32 values with the edges of the range among them."""
    rng = np.random.default_rng(seed)
    v = rng.integers(INT32_MIN, INT32_MAX, k, endpoint=True, dtype=np.int64).astype(np.int32)
    v[:min(k, len(EDGES))] = np.roll(EDGES, seed)[:k]
    return v


def set_busy(sw: SwitchTester, slot: int, busy: int) -> None:
    """Hold (1) or release (0) the slot's lock word, as another CPU would."""
    s = sw.maps.slots.lookup(slot)
    s.busy = busy
    sw.maps.slots.update(slot, s)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_copies_and_sums_are_exact_at_the_int32_edges(sw, world):
    job = sw.add_job(world=world)
    for rnd in range(3):  # the first round copies in; later ones overwrite the slot versions
        inputs = [values(sw.k, 3 * rnd + r) for r in range(world)]
        run = sw.round(job, 1, inputs, rnd=rnd)
        assert run.action == Action.TX
        want = np.sum(np.asarray(inputs, np.int64), axis=0).astype(np.int64).astype(np.int32)
        assert sw.result(run).values.tolist() == want.tolist()
    assert sw.counters()["completed"] == 3


def test_min_and_max_keep_the_int32_edges(sw):
    job = sw.add_job(world=2)
    a, b = values(sw.k, 1), values(sw.k, 2)
    for rnd, (op, fn) in enumerate([(wire.OP_MIN, np.minimum), (wire.OP_MAX, np.maximum)]):
        run = sw.round(job, 0, [a, b], rnd=rnd, op=op)
        assert sw.result(run).values.tolist() == fn(a, b).tolist()


def test_a_retransmission_gets_the_stored_result_whole(sw):
    """The shadow reply copies the slot out (64-bit copies) into a packet that
    carries other values: every element comes from the slot."""
    job = sw.add_job(world=2)
    a, b = values(sw.k, 4), values(sw.k, 5)
    sw.round(job, 2, [a, b])
    run = sw.run(sw.data(job, 0, 2, values(sw.k, 6)))
    assert run.action == Action.TX
    assert sw.result(run).values.tolist() == (a.astype(np.int64) + b).astype(np.int32).tolist()
    assert sw.counters() == only(rx=3, aggregated=1, completed=1, shadow_reply=1)


def test_a_slot_held_by_another_cpu_drops_the_packet_as_busy_and_changes_nothing(sw):
    job = sw.add_job(world=2)
    a, b = values(sw.k, 7), values(sw.k, 8)
    assert sw.run(sw.data(job, 0, 0, a)).action == Action.DROP  # slot 0 half full
    set_busy(sw, 0, 1)
    before = sw.slot_bytes()
    frame = sw.data(job, 1, 0, b)
    run = sw.run(frame)
    assert run.action == Action.DROP and run.frame == frame
    assert sw.slot_bytes() == before
    # Another slot is not held.
    assert sw.run(sw.data(job, 0, 1, a)).action == Action.DROP
    assert sw.counters() == only(rx=3, aggregated=2, busy=1)
    # Released: the retransmission completes the round exactly, and gives the word back.
    set_busy(sw, 0, 0)
    run = sw.run(frame)
    assert run.action == Action.TX
    assert sw.result(run).values.tolist() == (a.astype(np.int64) + b).astype(np.int32).tolist()
    assert sw.maps.slots.lookup(0).busy == 0


def test_two_cpus_on_the_same_slots_never_tear_a_result():
    """Two threads (the kernel runs each test run on its own CPU, where it has
    two) stream both ranks' packets of the same rounds at once through k=256
    slots: the lock word must keep every step whole. Rounds can replace each
    other (a thread runs ahead), so not every round completes; every RESULT
    that comes out must be the exact sum of its round, and every packet is
    accounted for."""
    require_bpf()
    import threading

    from switchml_xdp import bpf

    k, slots, n = 256, 4, 3000
    with SwitchTester(k=k, slots=slots) as sw:
        job = sw.add_job(world=2, slot_count=slots)

        def vals(seq: int, rank: int) -> np.ndarray:
            return np.full(k, seq * 7 + rank * 2**30, np.int64).astype(np.int32)

        frames = [[sw.data(job, r, seq % slots, vals(seq, r), seq=seq) for seq in range(n)]
                  for r in (0, 1)]
        bad: list[str] = []
        step = threading.Barrier(2)  # every 32 packets, so that the two stay on the same rounds

        def stream(rank: int) -> None:
            for seq, frame in enumerate(frames[rank]):
                if seq % 32 == 0:
                    step.wait(timeout=30)
                action, out, _ = bpf.prog_test_run(sw.prog.fd, frame)
                if action == Action.TX:
                    got = sw.result(Run(Action(action), out))
                    want = (vals(seq, 0).astype(np.int64) + vals(seq, 1)).astype(np.int32)
                    if int(got.header["seq"]) != seq or not np.array_equal(got.values, want):
                        bad.append(f"seq {seq}: {got.values[:4]} != {want[:4]}")

        def guarded(rank: int) -> None:
            try:
                stream(rank)
            except Exception as e:  # noqa: BLE001 - a thread's failure fails the test
                bad.append(repr(e))
                step.abort()

        threads = [threading.Thread(target=guarded, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        c = sw.counters()
        assert not bad, bad[:5]
        assert_accounted(c)
        assert c["rx"] == 2 * n and c["completed"] > 0, c  # rounds overtaken are stale


def test_status_of_a_switch_with_fewer_counter_rows_says_so_and_goes_on(switch_prog, monkeypatch):
    """A switch of another version (the counter table grew with `busy`): status
    run as root reads its pins, cannot read a row of ours, and notes it rather
    than failing for every switch on the machine."""
    from switchml_xdp.cli import status_view

    monkeypatch.setattr(wire, "COUNTER_NAMES", [*wire.COUNTER_NAMES, "a_row_from_the_future"])
    st = {"iface": switch_prog.pins_name}
    assert status_view._from_pins(st) is False
    assert "counters" not in st and "lookup" in st["note"], st
