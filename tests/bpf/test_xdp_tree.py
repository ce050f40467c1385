"""A rack box in a tree of boxes (xdp/swml_tree.h, docs/scale-out.md "A
tree of boxes"), one frame at a time through BPF_PROG_TEST_RUN: the round
complete among its members goes up to the parent as one member's DATA; a
member's retransmission sends it up again until the parent's RESULT came
down; the RESULT from above is checked, kept as the round's shadow and sent
on to the members signed with the local key; and the sums of two levels are
one box's, bit for bit."""
from __future__ import annotations

import time

import numpy as np
import pytest

from frames import Endpoint, parse_udp_frame, udp_frame
from switchml_xdp import wire
from switchml_xdp.switch.maps import UplinkEntry
from xdp_tester import PROG_K, PROG_SLOTS, Action, SwitchTester, assert_accounted, require_bpf

PARENT = Endpoint("02:5e:00:00:01:01", "10.254.0.1", wire.DEFAULT_PORT)
UPLINK = Endpoint("02:5e:00:00:01:02", "10.254.0.2", wire.DEFAULT_PORT)  # the rack box on the core
PARENT_JOB = 7
# SWML_UP_HOLD_NS (xdp/swml_tree.h) in the tests' build: long enough that a
# test run's next packet comes inside it however slow the machine.
HOLD_S = 0.05


def uplink_to(parent_rank: int, auth: int = wire.AUTH_HEADER, *, src: Endpoint = UPLINK,
              key: int = 0x1122334455667788, result_key: bytes = bytes(range(16)),
              parent: Endpoint = PARENT) -> UplinkEntry:
    return UplinkEntry(ifindex=SwitchTester.TEST_RUN_IFINDEX, parent_ip=parent.ip,
                       parent_port=parent.port, parent_mac=parent.mac, src_ip=src.ip,
                       src_port=src.port, src_mac=src.mac, job_id=PARENT_JOB, rank=parent_rank,
                       key=key, result_key=result_key, auth=auth)


@pytest.fixture(scope="module")
def rack_prog():
    require_bpf()
    with SwitchTester(k=PROG_K, slots=PROG_SLOTS, uplink=True,
                      defines={"SWML_UP_HOLD_NS": f"{int(HOLD_S * 1e9)}ULL"}) as tester:
        yield tester


@pytest.fixture
def rack(rack_prog):
    rack_prog.reset()
    yield rack_prog
    assert_accounted(rack_prog.counters())


def parent_result(up: UplinkEntry, slot: int, seq: int, values, *, ver: int = 0, exp: int = 0,
                  flags: int = 0, src: Endpoint = PARENT, result_key: bytes | None = None,
                  job: int = PARENT_JOB, dst_port: int | None = None, rank: int | None = None) -> bytes:
    """The parent's RESULT of a round, to the parent job's group, signed as
    the parent signs it (with `result_key`, default the uplink's), `rank`
    the member that completed it there (default: the rack box itself)."""
    vals = np.asarray(values, "<i4")
    rank = up.rank if rank is None else rank
    buf = bytearray(wire.pack_header(wire.TYPE_RESULT, job, rank, slot, seq, len(vals),
                                     flags | ver, exp) + vals.tobytes())
    wire.sign_result(buf, up.result_key if result_key is None else result_key, up.auth,
                     vals.nbytes)
    gip, gmac = wire.group_of_job(job)
    return udp_frame(src, Endpoint(gmac, gip, up.src_port if dst_port is None else dst_port),
                     bytes(buf))


def test_a_round_complete_in_the_rack_goes_up_as_one_member_of_the_parent_s_job(rack):
    up = uplink_to(parent_rank=4)
    job = rack.add_job(job_id=3, ranks=(4, 6), uplink=up)
    v4, v6 = np.arange(PROG_K) - 3, np.full(PROG_K, 1000)
    run = rack.round(job, 2, [v4, v6], rnd=1, exps=[-2, 5])
    assert run.action == Action.REDIRECT
    out = rack.result(run)
    h = out.header
    assert (out.frame.src, out.frame.dst) == (UPLINK, PARENT)
    assert out.frame.ip_checksum_ok and out.frame.ttl == 64
    assert out.type == wire.TYPE_DATA and out.version == wire.VERSION
    assert (int(h["job"]), int(h["rank"]), int(h["key"])) == (PARENT_JOB, 4, up.key)
    assert (int(h["slot"]), int(h["seq"]), int(h["exp"])) == (2, 1 * job.slot_count + 2, 5)
    assert int(h["flags"]) == 1 and int(h["owner"]) == 0   # round 1: version 1
    assert list(out.values) == list(v4 + v6)
    c = rack.counters()
    assert (c["aggregated"], c["completed"], c["sent_up"]) == (1, 1, 1)


def test_a_rank_outside_the_rack_is_refused(rack):
    job = rack.add_job(job_id=3, ranks=(4, 6), uplink=uplink_to(4))
    assert rack.run(rack.data(job, 5, 0)).action == Action.DROP
    assert rack.counters()["bad_rank"] == 1


def test_retransmissions_send_the_partial_up_again_until_the_parent_answers(rack):
    up = uplink_to(parent_rank=1)
    job = rack.add_job(job_id=2, ranks=(1, 2, 3), uplink=up)
    vals = [np.full(PROG_K, 10 * r) for r in (1, 2, 3)]
    first = rack.round(job, 0, vals, rnd=0)
    # A wave of resends right after the round went up (its members timed
    # out together on a late one's DATA): held, the partial is on its way.
    retrans = rack.data(job, 2, 0, vals[1], rnd=0, flags=wire.FLAG_RETRANS)
    assert rack.run(retrans).action == Action.DROP
    time.sleep(2 * HOLD_S)   # past the hold: the partial or the RESULT was lost
    again = rack.run(retrans)
    assert again.action == Action.REDIRECT
    out = rack.result(again)
    assert int(out.header["flags"]) & wire.FLAG_RETRANS
    assert list(out.values) == list(rack.result(first).values) == [60] * PROG_K
    assert out.frame.dst == PARENT
    assert rack.run(rack.data(job, 3, 0, vals[2], rnd=0, flags=wire.FLAG_RETRANS)).action == \
        Action.DROP   # the same wave: held again
    c = rack.counters()
    assert (c["sent_up"], c["resent_up"], c["up_held"], c["shadow_reply"]) == (1, 1, 2, 3)


@pytest.mark.parametrize("auth", [wire.AUTH_HEADER, wire.AUTH_FULL])
def test_the_parent_s_result_goes_on_to_the_members_and_becomes_the_shadow(rack, auth):
    up = uplink_to(parent_rank=0, auth=auth)
    job = rack.add_job(job_id=5, ranks=(0, 1), uplink=up, auth=auth)
    rack.round(job, 1, [np.ones(PROG_K), np.ones(PROG_K)], rnd=0)
    final = np.arange(PROG_K) * 7 - 20   # the whole job's sum, from above
    down = rack.run(parent_result(up, 1, 1, final, exp=3, flags=wire.FLAG_NONFINITE))
    assert down.action == Action.REDIRECT   # out of every port with a member
    res = rack.result(down)
    assert res.type == wire.TYPE_RESULT
    assert res.frame.src == rack.switch and res.frame.dst == job.group
    assert (int(res.header["job"]), int(res.header["exp"])) == (5, 3)
    assert int(res.header["flags"]) == wire.FLAG_NONFINITE   # version 0, not SHADOW
    assert int(res.header["rank"]) == 1   # this box's partial completed it: rank 1's DATA here
    assert list(res.values) == list(final)
    assert wire.result_authentic(res.frame.payload, len(res.frame.payload), job.result_key,
                                 auth, PROG_K * 4)
    # A member that missed it asks again: the shadow is the job's result now
    # (within the hold: a final round's shadow is not held).
    shadow = rack.run(rack.data(job, 1, 1, np.ones(PROG_K), rnd=0, flags=wire.FLAG_RETRANS))
    assert shadow.action == Action.TX
    sh = rack.result(shadow)
    assert list(sh.values) == list(final)
    assert int(sh.header["flags"]) == wire.FLAG_NONFINITE | wire.FLAG_SHADOW   # no slot bits
    # The parent's copy of the same RESULT (its shadow reply to a resend): dropped.
    assert rack.run(parent_result(up, 1, 1, final, exp=3)).action == Action.DROP
    # Another rack completed the parent's round: its rank stays, none of ours.
    rack.round(job, 2, [np.ones(PROG_K), np.ones(PROG_K)], rnd=0)
    other = rack.run(parent_result(up, 2, 2, final, rank=9))
    assert other.action == Action.REDIRECT and int(rack.result(other).header["rank"]) == 9
    c = rack.counters()
    assert (c["from_parent"], c["parent_copy"], c["shadow_reply"], c["resent_up"]) == (2, 1, 1, 0)


@pytest.mark.parametrize("slot", range(4))
def test_in_a_job_with_lanes_the_parent_s_result_goes_to_the_port_of_its_slot_s_lane(rack, slot):
    """Lanes below a rack box (docs/performance.md, "Several queues per
    worker"): the members' slot s DATA came from their port + s mod lanes,
    and the RESULT from above goes to the job's port + s mod lanes; the
    uplink is one lane (the parent job's slot s is this job's)."""
    from dataclasses import replace

    up = uplink_to(parent_rank=0)
    job = rack.add_job(job_id=5, ranks=(0, 1), uplink=up, lanes=2, result_port=40100)
    run = rack.round(job, slot, [np.ones(PROG_K), np.ones(PROG_K)], rnd=0)
    assert run.action == Action.REDIRECT and rack.result(run).frame.src == UPLINK
    down = rack.run(parent_result(up, slot, slot, np.full(PROG_K, 7)))
    assert down.action == Action.REDIRECT
    res = rack.result(down)
    assert res.frame.dst == replace(job.group, port=40100 + slot % 2)
    assert list(res.values) == [7] * PROG_K


def test_results_not_the_parent_s_are_dropped_and_counted(rack):
    up = uplink_to(parent_rank=0)
    job = rack.add_job(job_id=5, ranks=(0, 1), uplink=up)
    rack.round(job, 0, [np.ones(PROG_K), np.ones(PROG_K)], rnd=0)
    final = np.full(PROG_K, 99)
    forged = [parent_result(up, 0, 0, final, result_key=bytes(16)),      # not the parent's key
              parent_result(up, 0, 0, final, src=Endpoint(PARENT.mac, PARENT.ip, 9)),  # port
              parent_result(up, 1, 1, final)]        # a round the rack has not completed
    for frame in forged:
        assert rack.run(frame).action == Action.DROP
    assert rack.counters()["bad_parent"] == len(forged)
    # None of them became the shadow: a retransmission (past the hold) still goes up.
    time.sleep(2 * HOLD_S)
    assert rack.run(rack.data(job, 0, 0, rnd=0, flags=wire.FLAG_RETRANS)).action == Action.REDIRECT
    # Another parent's, or another job's: not routed to us, left to the stack.
    other = parent_result(up, 0, 0, final, job=PARENT_JOB + 1)
    assert rack.run(other).action == Action.PASS
    assert rack.counters()["other_host"] == 1
    # Not to the box's data port: not swml at all.
    assert rack.run(parent_result(up, 0, 0, final, dst_port=UPLINK.port + 1)).action == Action.PASS
    assert rack.counters()["passed"] == 1


def test_a_rack_of_one_sends_each_packet_up_at_once(rack):
    job = rack.add_job(job_id=4, ranks=(9,), uplink=uplink_to(parent_rank=9))
    run = rack.run(rack.data(job, 9, 3, np.full(PROG_K, 5), rnd=2))
    assert run.action == Action.REDIRECT
    assert list(rack.result(run).values) == [5] * PROG_K
    assert int(rack.result(run).header["rank"]) == 9


def test_16_bit_rounds_cannot_go_up_the_tree(rack):
    job = rack.add_job(job_id=4, ranks=(0, 1), uplink=uplink_to(0))
    frame = rack.data(job, 0, 0, np.ones(PROG_K), fmt=wire.FMT_INT16)
    assert rack.run(frame).action == Action.DROP
    assert rack.counters()["bad_op"] == 1


def test_a_rack_s_disagreement_reaches_the_whole_job(rack, sw):
    """Members of a rack made different calls: the partial goes up marked
    DISAGREE, and the parent's RESULT carries it to every rack."""
    job = rack.add_job(job_id=3, ranks=(0, 1), uplink=uplink_to(0))
    up = rack.round(job, 0, [np.ones(PROG_K), np.ones(PROG_K)], rnd=0, tags=[1, 2])
    assert int(rack.result(up).header["flags"]) & wire.FLAG_DISAGREE
    parent = sw.add_job(job_id=1, world=2)
    sw.run(sw.data(parent, 0, 0, np.ones(PROG_K), flags=wire.FLAG_DISAGREE, tag=1))
    res = sw.run(sw.data(parent, 1, 0, np.ones(PROG_K), tag=1))
    assert int(sw.result(res).header["flags"]) & wire.FLAG_DISAGREE
    assert sw.counters()["disagreed"] == 0   # the round's own ranks agreed


def test_two_racks_and_a_parent_sum_exactly_as_one_box(rack_prog, sw):
    """Racks {0,1,2} and {3,4} under a parent, random int32 (wrapping) and
    offset-binary payloads: the RESULT every member gets is one box's."""
    rng = np.random.default_rng(7)
    for fmt in (wire.FMT_INT32, wire.FMT_OFFSET32):
        sw.reset()
        vals = rng.integers(-2**31, 2**31, (5, PROG_K), dtype=np.int64).astype(np.int32)
        if fmt == wire.FMT_OFFSET32:
            vals = rng.integers(0, 2**28, (5, PROG_K)).astype(np.int32)
        one_box = sw.add_job(job_id=9, world=5)
        flat = sw.result(sw.round(one_box, 0, list(vals), rnd=0, fmts=[fmt] * 5)).values
        # The parent: two children, ranked by their lowest rank (0 and 3), at
        # their uplinks' addresses.
        parent = sw.add_job(job_id=PARENT_JOB, ranks=(0, 3), slot_base=4)
        partials = []
        for ranks, src in (((0, 1, 2), sw.member(parent, 0)), ((3, 4), sw.member(parent, 3))):
            rack_prog.reset()
            up = uplink_to(ranks[0], src=src, key=parent.key, result_key=parent.result_key)
            job = rack_prog.add_job(job_id=1, ranks=ranks, uplink=up)
            run = rack_prog.round(job, 0, [vals[r] for r in ranks], rnd=0, fmts=[fmt] * len(ranks))
            partials.append(run.frame)
        # The child's DATA, addressed to PARENT: the tester's switch is at another address.
        runs = [sw.run(udp_frame(sw.member(parent, r), sw.switch, parse_udp_frame(f).payload))
                for r, f in zip((0, 3), partials)]
        assert runs[0].action == Action.DROP and runs[1].action == Action.TX
        assert list(sw.result(runs[1]).values) == list(flat)
        rack_prog.reset()


def test_a_result_lost_on_the_way_down_comes_back_through_the_parent_s_shadow(rack, sw):
    """The parent's RESULT never reaches the rack box: a member's timeout
    sends the partial up again (RETRANS), the parent answers it from its
    shadow, unicast to the rack box's uplink, and the rack box takes that
    answer as the round's result and sends it on."""
    parent = sw.add_job(job_id=PARENT_JOB, ranks=(0, 2), slot_base=4)
    uplink = Endpoint(UPLINK.mac, "10.254.0.9", wire.DEFAULT_PORT)   # the rack box's member address
    sw.maps.write_member(PARENT_JOB, 0, uplink.ip, uplink.port)
    up = uplink_to(0, src=uplink, key=parent.key, result_key=parent.result_key, parent=sw.switch)
    job = rack.add_job(job_id=1, ranks=(0, 1), uplink=up)
    vals = [np.full(PROG_K, 3), np.full(PROG_K, 4), np.full(PROG_K, 100)]

    def to_parent(run):   # the rack box's DATA, as the parent's port receives it
        return udp_frame(uplink, sw.switch, parse_udp_frame(run.frame).payload)

    partial = rack.round(job, 0, vals[:2], rnd=0)
    assert sw.run(to_parent(partial)).action == Action.DROP
    assert sw.run(sw.data(parent, 2, 0, vals[2], rnd=0)).action == Action.TX   # lost, below
    time.sleep(2 * HOLD_S)
    again = rack.run(rack.data(job, 1, 0, vals[1], rnd=0, flags=wire.FLAG_RETRANS))
    assert again.action == Action.REDIRECT
    shadow = sw.run(to_parent(again))
    assert shadow.action == Action.TX and sw.result(shadow).frame.dst == uplink
    assert int(sw.result(shadow).header["flags"]) & wire.FLAG_SHADOW
    down = rack.run(shadow.frame)
    assert down.action == Action.REDIRECT
    res = rack.result(down)
    assert list(res.values) == [107] * PROG_K and res.frame.dst == job.group
    # SHADOW kept: the round's RESULT was lost on its way here, a loss for
    # every member (their probes resend what they deferred at once); the
    # rank that completed the round here, rank 1, as a box of its own says.
    assert int(res.header["flags"]) == wire.FLAG_SHADOW and int(res.header["job"]) == 1
    assert int(res.header["rank"]) == 1
    c, p = rack.counters(), sw.counters()
    assert (c["sent_up"], c["resent_up"], c["from_parent"]) == (1, 1, 1), c
    assert (p["completed"], p["shadow_reply"]) == (1, 1), p


@pytest.mark.parametrize("fanout", ["multicast", "unicast"])
def test_a_rack_box_of_two_rack_ports_loads_and_sends_up(fanout):
    """The build of a rack box whose rack has two ports (SWML_PORTS=2 beside
    SWML_UPLINK: the port places, the devmap or the fan-out, and the way up)
    passes the verifier and sends a complete round up."""
    require_bpf()
    with SwitchTester(k=PROG_K, slots=PROG_SLOTS, uplink=True, fanout=fanout,
                      defines={"SWML_PORTS": 2}) as box:
        job = box.add_job(job_id=2, ranks=(3, 5), uplink=uplink_to(3))
        run = box.round(job, 1, [np.full(PROG_K, 2), np.full(PROG_K, 5)], rnd=0)
        assert run.action == Action.REDIRECT
        assert list(box.result(run).values) == [7] * PROG_K
        assert box.counters()["sent_up"] == 1
