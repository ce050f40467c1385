"""xdp/swml_switch.c, wire v2: what makes a packet current, who may send it,
and how a round combines (docs/design.md, "Data plane"; docs/protocol.md).

Rounds are told apart by seq in serial-number arithmetic: stale and replayed
packets change nothing and stall nothing; a newer round restarts a slot
version whatever state it was left in; the seq may wrap. The data key and
the switch's own MAC/IP decide what is ours. SUM, MIN and MAX combine; a
contribution with another tag or op than its round's marks it DISAGREE.
Through BPF_PROG_TEST_RUN (tests/xdp_tester.py), no lab.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from frames import BROADCAST
from switchml_xdp import ordered, wire
from xdp_tester import PROG_K, PROG_SLOTS, Action, SwitchTester, only

K, SLOTS = PROG_K, PROG_SLOTS
S = 4  # the test job's slots
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def vec(*values: int) -> np.ndarray:
    out = np.zeros(K, np.int32)
    out[:len(values)] = values
    return out


def values(run) -> list[int]:
    return list(SwitchTester.result(run).values)


# ------------------------------------------------------------ what is addressed to us

@pytest.mark.parametrize("where", ["another host's MAC", "another IP", "broadcast MAC",
                                   "multicast MAC"])
def test_frames_to_our_port_but_not_to_us_are_passed_and_touch_nothing(sw, where):
    """A bridge floods unknown unicast; a router forwards; neither is a contribution."""
    job = sw.add_job(world=1, slot_count=S)
    dst = {"another host's MAC": replace(sw.switch, mac="02:5e:00:00:00:02"),
           "another IP": replace(sw.switch, ip="10.255.0.2"),
           "broadcast MAC": replace(sw.switch, mac=BROADCAST),
           "multicast MAC": replace(sw.switch, mac="01:00:5e:00:00:01")}[where]
    before = sw.slot_bytes()
    frame = sw.data(job, 0, dst=dst)
    assert sw.run(frame) == (Action.PASS, frame)
    assert sw.slot_bytes() == before
    assert sw.counters() == only(other_host=1)


# ------------------------------------------------------------ rounds

def test_a_replay_of_every_packet_of_a_finished_job_changes_nothing(sw):
    """Every packet two ranks sent over 3 rounds of every slot, replayed in
    order, then in reverse: all stale or shadow replies of the last rounds;
    the slots' contents do not change and the next round is exact."""
    job = sw.add_job(world=2, slot_count=S)
    sent = []
    for r in range(3):
        for slot in range(S):
            for rank in range(2):
                f = sw.data(job, rank, slot, vec(r, slot, rank + 1), rnd=r)
                sent.append(f)
                sw.run(f)
    before = sw.slot_bytes()
    c0 = sw.counters()
    for f in sent + sent[::-1]:
        run = sw.run(f)
        if run.action == Action.TX:  # a packet of the last round: its stored result, to it alone
            assert SwitchTester.result(run).header["flags"] & wire.FLAG_SHADOW
    assert sw.slot_bytes() == before
    c = sw.counters()
    replayed = {n: c[n] - c0[n] for n in ("stale", "shadow_reply", "aggregated", "completed")}
    # Rounds 0 and 1 are stale (round 1's version holds round 1 still: 1 round back
    # in the other version is current there, so its packets are shadow replies).
    assert replayed["aggregated"] == replayed["completed"] == 0, replayed
    assert replayed["stale"] == 2 * 2 * S, replayed          # round 0, both passes
    assert replayed["shadow_reply"] == 2 * 2 * 2 * S, replayed  # rounds 1 and 2
    for slot in range(S):  # and the job goes on
        sw.run(sw.data(job, 0, slot, vec(5), rnd=3))
        assert values(sw.run(sw.data(job, 1, slot, vec(6), rnd=3))) == list(vec(11))


def test_a_late_duplicate_of_an_old_round_does_not_wedge_the_slot(sw):
    """The v1 failure: one old packet taken as the next round's contribution."""
    job = sw.add_job(world=2, slot_count=S)
    old = sw.data(job, 1, 0, vec(1000), rnd=0)
    sw.round(job, 0, [vec(1), vec(2)], rnd=0)
    sw.round(job, 0, [vec(3), vec(4)], rnd=1)
    assert sw.run(sw.data(job, 0, 0, vec(5), rnd=2)).action == Action.DROP
    assert sw.run(old).action == Action.DROP  # stale: not rank 1's round-2 contribution
    assert values(sw.run(sw.data(job, 1, 0, vec(6), rnd=2))) == list(vec(11))
    assert sw.counters()["stale"] == 1


def test_a_newer_round_restarts_a_version_left_half_full(sw):
    """A call that failed leaves rounds half full; the next call's packets (a
    newer seq) start afresh there, with nothing of the old sums."""
    job = sw.add_job(world=3, slot_count=S)
    sw.run(sw.data(job, 0, 2, vec(100, 100), rnd=0))
    sw.run(sw.data(job, 1, 2, vec(100, 100), rnd=0))
    run = sw.round(job, 2, [vec(1), vec(2), vec(3)], rnd=2)
    assert values(run) == list(vec(6))


def test_a_newer_round_while_the_version_is_complete_starts_fresh(sw):
    job = sw.add_job(world=2, slot_count=S)
    sw.round(job, 1, [vec(7), vec(7)], rnd=0)
    run = sw.round(job, 1, [vec(1), vec(2)], rnd=2, exps=[-5, -6])
    h = SwitchTester.result(run).header
    assert values(run) == list(vec(3)) and h["exp"] == -5 and h["seq"] == 2 * S + 1


def test_the_first_packet_of_a_job_may_have_any_seq(sw):
    """Slots start empty (the control plane zeroes them): the job's first
    packet is current whatever its seq, including one that is 'older' than 0."""
    job = sw.add_job(world=2, slot_count=S)
    run = sw.round(job, 0, [vec(1), vec(2)], rnd=0, )
    assert values(run) == list(vec(3))
    job2 = sw.add_job(job_id=2, world=1, slot_base=8, slot_count=S)
    assert sw.run(sw.data(job2, 0, 0, vec(9), seq=0xFFFFFFF0, ver=0)).action == Action.TX


def test_rounds_run_through_the_wrap_of_seq(sw):
    """seq counts packets mod 2**32; comparisons are serial (RFC 1982)."""
    job = sw.add_job(world=2, slot_count=S)
    base = 2**32 - 2 * S  # rounds 0 and 1 before the wrap, 2 and 3 after it
    stale = []
    for r in range(6):
        seq = (base + r * S) & 0xFFFFFFFF
        stale.append(sw.data(job, 1, 0, vec(99), seq=seq, ver=r % 2))
        sw.run(sw.data(job, 0, 0, vec(r), seq=seq, ver=r % 2))
        run = sw.run(sw.data(job, 1, 0, vec(10), seq=seq, ver=r % 2))
        assert values(run) == list(vec(r + 10)), r
        assert SwitchTester.result(run).header["seq"] == seq
    for f in stale[:4]:  # rounds 0-3: two or more rounds back in their version
        assert sw.run(f).action == Action.DROP
    assert sw.counters()["stale"] == 4


def test_a_retransmission_carries_its_round_s_seq(sw):
    """Same slot, same version, another seq: not a retransmission of this round."""
    job = sw.add_job(world=2, slot_count=S)
    sw.round(job, 0, [vec(1), vec(2)], rnd=2)
    shadow = sw.run(sw.data(job, 0, 0, rnd=2, flags=wire.FLAG_RETRANS))
    assert shadow.action == Action.TX and values(shadow) == list(vec(3))
    assert sw.run(sw.data(job, 0, 0, rnd=0, flags=wire.FLAG_RETRANS)).action == Action.DROP
    assert sw.counters() == only(rx=4, aggregated=1, completed=1, shadow_reply=1, stale=1)


# ------------------------------------------------------------ ops

@pytest.mark.parametrize("op, combine", [(wire.OP_MIN, np.minimum.reduce),
                                         (wire.OP_MAX, np.maximum.reduce)])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_min_and_max_over_the_whole_int32_range(sw, op, combine, world):
    rng = np.random.default_rng(world + 10 * op)
    xs = rng.integers(INT32_MIN, INT32_MAX, size=(world, K), endpoint=True,
                      dtype=np.int64).astype(np.int32)
    xs[0, :2] = (INT32_MIN, INT32_MAX)
    job = sw.add_job(world=world, slot_count=S)
    run = sw.round(job, 1, list(xs), op=op)
    np.testing.assert_array_equal(SwitchTester.result(run).values, combine(xs))
    assert SwitchTester.result(run).header["op"] == op


@pytest.mark.parametrize("op, combine", [(wire.OP_MIN, np.minimum.reduce),
                                         (wire.OP_MAX, np.maximum.reduce)])
def test_float_min_and_max_are_exact_through_the_order_preserving_map(sw, op, combine):
    xs = np.array([[1.5, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.0, 7.0],
                   [2.5, 0.0, 1.0, -1e38, 3.0, -1e-45, np.nan, 7.0],
                   [-1.0, -0.0, -np.inf, 5.0, 4.0, 0.0, -2.0, 7.0]], np.float32)
    job = sw.add_job(world=3, slot_count=S)
    run = sw.round(job, 0, [ordered.to_ordered(x, op) for x in xs], op=op)
    got = ordered.from_ordered(SwitchTester.result(run).values)
    want = combine(xs)
    # numpy leaves the sign of max(-0.0, +0.0) unspecified; IEEE 754-2019's
    # maximum/minimum (and the map) order -0.0 below +0.0.
    zeros = want == 0
    pos = (xs == 0) & ~np.signbit(xs)
    want[zeros] = np.where((pos.any(0) if op == wire.OP_MAX else pos.all(0))[zeros], 0.0, -0.0)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert got[finite].tobytes() == want[finite].tobytes()  # bit for bit, -0.0 included


def test_the_op_is_the_round_s_not_the_slot_s(sw):
    job = sw.add_job(world=2, slot_count=S)
    assert values(sw.round(job, 0, [vec(1, 9), vec(5, 2)], rnd=0, op=wire.OP_MAX)) == list(vec(5, 9))
    assert values(sw.round(job, 0, [vec(1, 9), vec(5, 2)], rnd=1, op=wire.OP_MIN)) == list(vec(1, 2))
    assert values(sw.round(job, 0, [vec(1, 9), vec(5, 2)], rnd=2)) == list(vec(6, 11))


# ------------------------------------------------------------ disagreement

@pytest.mark.parametrize("what", ["tag", "op"])
def test_a_contribution_of_another_call_marks_the_round_for_every_rank(sw, what):
    job = sw.add_job(world=3, slot_count=S)
    tags = [7, 7, 8] if what == "tag" else [7, 7, 7]
    if what == "tag":
        run = sw.round(job, 0, [vec(1)] * 3, tags=tags)
    else:
        sw.run(sw.data(job, 0, 0, vec(1), tag=7))
        sw.run(sw.data(job, 1, 0, vec(1), tag=7))
        run = sw.run(sw.data(job, 2, 0, vec(1), tag=7, op=wire.OP_MAX))
    assert run.action == Action.TX
    h = SwitchTester.result(run).header
    assert h["flags"] & wire.FLAG_DISAGREE and h["tag"] == 7
    # A rank that missed it asks again and hears the same.
    shadow = SwitchTester.result(sw.run(sw.data(job, 0, 0, flags=wire.FLAG_RETRANS, tag=7)))
    assert shadow.header["flags"] & wire.FLAG_DISAGREE
    assert sw.counters() == only(rx=4, aggregated=2, completed=1, shadow_reply=1, disagreed=1)
    # The next round of the slot is clean.
    run = sw.round(job, 0, [vec(1), vec(2), vec(3)], rnd=2, tags=[9, 9, 9])
    assert not SwitchTester.result(run).header["flags"] & wire.FLAG_DISAGREE
    assert values(run) == list(vec(6))


# ------------------------------------------------------------ per-job counters

def test_per_job_counters_count_what_reached_a_slot(sw):
    a = sw.add_job(job_id=1, world=2, slot_base=0, slot_count=S)
    b = sw.add_job(job_id=2, world=1, slot_base=S, slot_count=S)
    frame_len = len(sw.data(a, 0))
    sw.round(a, 0, [vec(1), vec(2)])
    sw.run(sw.data(a, 0, 0, flags=wire.FLAG_RETRANS))       # shadow reply
    sw.run(sw.data(a, 1, 0, key=a.key ^ 1))                 # bad key: not a's
    sw.run(sw.data(a, 1, 0, rnd=0, seq=2**31))              # stale: not counted
    sw.run(sw.data(b, 0, 1))
    stats = sw.maps.read_job_stats()
    assert stats[1] == {"packets": 3, "bytes": 3 * frame_len, "results": 1, "shadow_replies": 1}
    assert stats[2] == {"packets": 1, "bytes": frame_len, "results": 1, "shadow_replies": 0}
    sw.maps.clear_job(b.id, b.world)
    assert set(sw.maps.read_job_stats()) == {1}
    again = sw.add_job(job_id=2, world=1, slot_base=S, slot_count=S)  # a new job, counted anew
    assert sw.maps.read_job_stats()[again.id]["packets"] == 0
