"""The switch program built for `swml-switch up --fanout unicast`, through
BPF_PROG_TEST_RUN: a completed RESULT passed up, marked, to the tc fan-out
(xdp/swml_fanout.c), which sends a copy to each member; members' MACs learnt
from their checked DATA; shadow replies still unicast by XDP_TX."""
from __future__ import annotations

import ctypes as ct
from dataclasses import replace

from switchml_xdp import bpf, layout, wire
from xdp_tester import (
    Action,
    only,
    vec,
)


def test_unicast_fanout_passes_a_completed_result_up_to_the_tc_fanout(usw):
    """XDP cannot clone: the RESULT (to the group, as with multicast) goes to
    the stack with XDP_PASS, where xdp/swml_fanout.c copies it to each member."""
    job = usw.add_job(job_id=7, world=2, result_port=40123)
    run = usw.round(job, 1, [vec(1, 2), vec(10, 20)])
    assert run.action == Action.PASS
    # The test run hands back the metadata in front of the frame: the mark.
    Meta = layout.ctype("swml_fanout_meta")
    meta = Meta.from_buffer_copy(run.frame)
    assert (meta.magic, meta.job) == (layout.DEFINES["swml_maps.h"]["SWML_FANOUT_META_MAGIC"], 7)
    res = usw.result(run._replace(frame=run.frame[ct.sizeof(Meta):]))
    assert res.frame.dst == job.group and res.frame.ip_checksum_ok
    assert list(res.values[:2]) == [11, 22] and res.type == wire.TYPE_RESULT
    assert usw.counters() == only(rx=2, aggregated=1, completed=1)


def test_a_round_s_owner_reaches_the_tc_fanout_in_the_result(usw):
    """A reduce_scatter's round names the rank that keeps its sum (DATA
    `owner`, 1 + rank); the RESULT handed to the tc fan-out keeps it, which
    sends the payload to that rank only (tests/lab/test_shard_fanout.py)."""
    job = usw.add_job(world=3)
    run = usw.round(job, 3, [vec(1), vec(2), vec(3)], owner=2)
    assert run.action == Action.PASS
    res = usw.result(run._replace(frame=run.frame[ct.sizeof(layout.ctype("swml_fanout_meta")):]))
    assert res.header["owner"] == 2 and not res.header["flags"] & wire.FLAG_HEADER_ONLY
    assert list(res.values[:1]) == [6]
    # A retransmission's shadow reply carries it too, and the whole sum.
    run = usw.run(usw.data(job, 0, slot=3, values=vec(1), flags=wire.FLAG_RETRANS, owner=2))
    assert run.action == Action.TX and usw.result(run).header["owner"] == 2


def test_unicast_fanout_learns_each_member_s_mac_from_its_checked_data(usw):
    job = usw.add_job(world=2)
    assert learnt_mac(usw, job, 0) == "00:00:00:00:00:00"   # not from the control plane
    usw.round(job, 0, [vec(1), vec(2)])
    assert [learnt_mac(usw, job, r) for r in (0, 1)] == [usw.member(job, r).mac for r in (0, 1)]
    # A packet that fails a check teaches nothing: here, the wrong key.
    forged = replace(usw.member(job, 0), mac="02:66:66:66:66:66")
    assert usw.run(usw.data(job, 0, slot=1, key=job.key ^ 1, src=forged)).action == Action.DROP
    assert learnt_mac(usw, job, 0) == usw.member(job, 0).mac
    # A checked one moves it (the rank's next hop changed).
    assert usw.run(usw.data(job, 0, slot=1, src=forged)).action == Action.DROP   # aggregated
    assert learnt_mac(usw, job, 0) == forged.mac


def test_unicast_fanout_keeps_shadow_replies_unicast_by_xdp_tx(usw):
    job = usw.add_job(world=2)
    usw.round(job, 2, [vec(5), vec(6)])
    run = usw.run(usw.data(job, 1, slot=2, values=vec(9), flags=wire.FLAG_RETRANS))
    assert run.action == Action.TX
    res = usw.result(run)
    assert res.frame.dst == usw.member(job, 1) and res.values[0] == 11
    assert res.header["flags"] & wire.FLAG_SHADOW


def test_the_default_multicast_fanout_sends_the_result_itself(sw):
    """The control for the unicast case: the same round, XDP_TX to the group."""
    job = sw.add_job(world=2)
    assert sw.round(job, 1, [vec(1), vec(2)]).action == Action.TX
    assert sw.maps.members.lookup(job.id * wire.MAX_WORLD).mac[:] == [0] * 6


def test_the_tc_fanout_leaves_a_frame_without_the_switch_s_mark_alone(usw):
    """Only the switch program's metadata asks for a fan-out: a RESULT-shaped
    frame from the network (here the very frame the switch produced, without
    its metadata) goes on untouched (TC_ACT_OK) and is copied to nobody."""
    from switchml_xdp.switch.dataplane import SwitchParams
    from switchml_xdp.switch.xdp_dataplane import FANOUT_SOURCE, load_fanout, program_defines

    TC_ACT_OK = 0   # include/uapi/linux/pkt_cls.h
    job = usw.add_job(world=2)
    run = usw.round(job, 0, [vec(1), vec(2)])
    frame = run.frame[ct.sizeof(layout.ctype("swml_fanout_meta")):]
    defines = program_defines(SwitchParams(usw.k, usw.slots, usw.port),
                              bpf.pin_dir(usw.pins_name), usw.switch.ip, usw.switch.mac, "unicast")
    with bpf.compile_program(FANOUT_SOURCE, None, defines, maps_only=True) as prog:
        retval, out, _ = bpf.prog_test_run(load_fanout(prog), frame)
    assert retval == TC_ACT_OK and out == frame
    assert usw.counters() == only(rx=2, aggregated=1, completed=1)


def learnt_mac(sw, job, rank) -> str:
    m = sw.maps.members.lookup(job.id * wire.MAX_WORLD + rank)
    return ":".join(f"{b:02x}" for b in bytes(m.mac))
