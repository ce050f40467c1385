"""xdp/swml_switch.c rule by rule, on crafted frames through BPF_PROG_TEST_RUN
(tests/xdp_tester.py): no lab, no namespaces, one compile for the module.

A new data-plane rule gets its case here first: build the frame with
sw.data(...) (or frames.py for foreign traffic), run it, and assert the
verdict, the frame that comes back and sw.counters(). Every test ends by
checking that each packet of ours was counted in exactly one outcome.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from frames import (
    BROADCAST,
    ETH_P_IP,
    IP_DF,
    IP_MF,
    IP_OPTIONS_NOP,
    Endpoint,
    arp_request,
    ethernet,
    ipv4_checksum,
    ipv6_udp_frame,
    parse_udp_frame,
    tcp_frame,
    udp_frame,
)
from switchml_xdp import wire
from xdp_tester import (
    PROG_K,
    PROG_SLOTS,
    Action,
    SwitchTester,
    assert_accounted,
    only,
    require_bpf,
    vec,
)

K, SLOTS = PROG_K, PROG_SLOTS  # elements a packet: small frames, readable values
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1


def wrapped_sum(contributions) -> np.ndarray:
    """What int32 hardware adds up: the exact sum modulo 2**32."""
    return np.sum(np.asarray(contributions, np.int64), axis=0).astype(np.int32)


# ------------------------------------------------------------ the fixtures themselves (no kernel)

def test_frames_carry_valid_checksums_and_parse_back():
    header = bytes.fromhex("450000730000400040110000c0a80001c0a800c7")  # RFC 1071-style example
    assert ipv4_checksum(header) == 0xB861
    src, dst = Endpoint("02:00:00:00:00:01", "10.0.0.2", 41000), Endpoint(BROADCAST, "10.0.0.1", 9)
    frame = parse_udp_frame(udp_frame(src, dst, b"datagram") + bytes(4))
    assert (frame.src, frame.dst, frame.ttl) == (src, dst, 64)
    assert frame.ip_checksum_ok and frame.payload == b"datagram"  # not the Ethernet padding


# ------------------------------------------------------------ not ours: passed untouched

STRANGER = Endpoint("02:00:00:00:00:99", "10.255.9.9", 5555)
# A valid swml datagram, sent where it does not belong.
SWML = wire.datagram(wire.TYPE_DATA, 1, 0, 0, 0, np.ones(K, np.int32))
FOREIGN = {  # name -> the frame, given the switch's address
    "arp request": lambda sw: arp_request(STRANGER, sw.switch.ip),
    "ipv6 udp to the port": lambda sw: ipv6_udp_frame(STRANGER.mac, sw.switch.mac, STRANGER.port,
                                                      sw.port, SWML),
    "tcp to the port": lambda sw: tcp_frame(STRANGER, sw.switch),
    "udp to another port": lambda sw: udp_frame(STRANGER, replace(sw.switch, port=sw.port + 1),
                                                SWML),
    "ip options, udp to another port": lambda sw: udp_frame(
        STRANGER, replace(sw.switch, port=sw.port + 1), SWML, ip_options=IP_OPTIONS_NOP),
    "vlan tagged": lambda sw: ethernet(sw.switch.mac, STRANGER.mac, 0x8100,  # 802.1Q, VLAN 1
                                       bytes([0, 1]) + ETH_P_IP.to_bytes(2, "big")
                                       + udp_frame(STRANGER, sw.switch, SWML)[14:]),
    # Too short to show a UDP port: not attributable to us, the kernel judges it.
    "ethernet header only": lambda sw: udp_frame(STRANGER, sw.switch, SWML)[:14],
    "cut in the ip header": lambda sw: udp_frame(STRANGER, sw.switch, SWML)[:14 + 19],
    "cut in the udp header": lambda sw: udp_frame(STRANGER, sw.switch, SWML)[:14 + 20 + 7],
}


@pytest.mark.parametrize("name", FOREIGN)
def test_foreign_traffic_is_passed_untouched_and_counted(sw, name):
    sw.add_job()
    frame = FOREIGN[name](sw)
    run = sw.run(frame)
    assert run.action == Action.PASS
    assert run.frame == frame
    assert sw.counters() == only(passed=1)


# ------------------------------------------------------------ ours, malformed or foreign: dropped

HEADERS = wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN  # where the swml header starts
DROPS = {  # name -> (counter, rank 1's contribution to slot 0 of a job of 2, broken one way)
    "cut after the udp header": ("truncated", lambda sw, job: sw.data(job, 1)[:HEADERS]),
    "cut in the swml header": ("truncated", lambda sw, job: sw.data(job, 1)[:HEADERS + 1]),
    "cut at the swml header's end": ("truncated",
                                     lambda sw, job: sw.data(job, 1)[:wire.HEADERS_LEN - 1]),
    "no payload": ("truncated", lambda sw, job: sw.data(job, 1)[:wire.HEADERS_LEN]),
    "cut in the payload": ("truncated", lambda sw, job: sw.data(job, 1)[:-1]),
    "ip options": ("bad_ip", lambda sw, job: sw.data(job, 1, ip_options=IP_OPTIONS_NOP)),
    "first fragment": ("bad_ip", lambda sw, job: sw.data(job, 1, frag_off=IP_MF)),
    "later fragment": ("bad_ip", lambda sw, job: sw.data(job, 1, frag_off=IP_DF | 1)),
    "last fragment": ("bad_ip", lambda sw, job: sw.data(job, 1, frag_off=185)),
    "ip length too long": ("bad_ip", lambda sw, job: sw.data(job, 1, ip_length=wire.IP_LEN
                                                              + wire.UDP_LEN + wire.HDR_LEN
                                                              + 4 * K + 4)),
    "ip length too short": ("bad_ip", lambda sw, job: sw.data(job, 1, ip_length=wire.IP_LEN
                                                               + wire.UDP_LEN + wire.HDR_LEN)),
    "udp length too long": ("bad_ip", lambda sw, job: sw.data(job, 1, udp_length=wire.UDP_LEN
                                                               + wire.HDR_LEN + 4 * K + 4)),
    "udp length too short": ("bad_ip", lambda sw, job: sw.data(job, 1, udp_length=wire.UDP_LEN
                                                                + wire.HDR_LEN + 4 * K - 4)),
    "version 0": ("bad_version", lambda sw, job: sw.data(job, 1, ver_type=wire.TYPE_DATA)),
    "version 1": ("bad_version", lambda sw, job: sw.data(job, 1, ver_type=0x10 | wire.TYPE_DATA)),
    "version 15": ("bad_version", lambda sw, job: sw.data(job, 1, ver_type=0xF0 | wire.TYPE_DATA)),
    "type result": ("bad_type", lambda sw, job: sw.data(job, 1, kind=wire.TYPE_RESULT)),
    "type 0": ("bad_type", lambda sw, job: sw.data(job, 1, kind=0)),
    "type 15": ("bad_type", lambda sw, job: sw.data(job, 1, kind=15)),
    "count k-1": ("bad_count", lambda sw, job: sw.data(job, 1, values=np.ones(K - 1))),
    "count k+1": ("bad_count", lambda sw, job: sw.data(job, 1, values=np.ones(K + 1))),
    "count 0": ("bad_count", lambda sw, job: sw.data(job, 1, values=[])),
    "count k+1, payload k": ("bad_count", lambda sw, job: sw.data(job, 1, count=K + 1)),
    "job not registered": ("unknown_job", lambda sw, job: sw.data(replace(job, id=2), 1)),
    "job 0": ("unknown_job", lambda sw, job: sw.data(replace(job, id=0), 1)),
    "job past the table": ("unknown_job",
                           lambda sw, job: sw.data(replace(job, id=wire.MAX_JOBS), 1)),
    "job 65535": ("unknown_job", lambda sw, job: sw.data(replace(job, id=65535), 1)),
    "rank = world": ("bad_rank", lambda sw, job: sw.data(job, 2)),
    "rank 64": ("bad_rank", lambda sw, job: sw.data(job, wire.MAX_WORLD)),
    "rank 65535": ("bad_rank", lambda sw, job: sw.data(job, 65535)),
    "another host": ("bad_source", lambda sw, job: sw.data(
        job, 1, src=replace(sw.member(job, 1), ip="10.0.1.99"))),
    "another port": ("bad_source", lambda sw, job: sw.data(
        job, 1, src=replace(sw.member(job, 1), port=sw.member(job, 1).port + 100))),
    "rank 0's address": ("bad_source", lambda sw, job: sw.data(job, 1, src=sw.member(job, 0))),
    "slot = slot_count": ("bad_slot", lambda sw, job: sw.data(job, 1, slot=job.slot_count)),
    "slot 65535": ("bad_slot", lambda sw, job: sw.data(job, 1, slot=65535)),
    "another key": ("bad_key", lambda sw, job: sw.data(job, 1, key=job.key ^ 1)),
    "key zero": ("bad_key", lambda sw, job: sw.data(job, 1, key=0)),
    "key of another job": ("bad_key", lambda sw, job: sw.data(
        job, 1, key=sw.add_job(job_id=9, world=1, slot_base=8, key=job.key + 7).key)),
    "op 3": ("bad_op", lambda sw, job: sw.data(job, 1, op=wire.OP_NUM)),
    "op 255": ("bad_op", lambda sw, job: sw.data(job, 1, op=255)),
    "format 1": ("bad_op", lambda sw, job: sw.data(job, 1, fmt=wire.FMT_NUM)),
    "round before": ("stale", lambda sw, job: sw.data(job, 1, seq=-2 * job.slot_count & 0xFFFFFFFF,
                                                       ver=0)),
    "round 2^31 before": ("stale", lambda sw, job: sw.data(job, 1, seq=2**31, ver=0)),
}


@pytest.mark.parametrize("name", DROPS)
def test_malformed_or_foreign_is_dropped_by_reason_and_touches_no_slot(sw, name):
    reason, make = DROPS[name]
    job = sw.add_job(world=2)
    assert sw.run(sw.data(job, 0, 0, vec(1, 2, 3))).action == Action.DROP  # slot 0 half full
    before = sw.slot_bytes()
    frame = make(sw, job)
    run = sw.run(frame)
    assert run.action == Action.DROP
    assert run.frame == frame
    assert sw.slot_bytes() == before
    assert sw.counters() == only(rx=2, aggregated=1, **{reason: 1})
    # The honest rank 1 still completes the round exactly.
    run = sw.run(sw.data(job, 1, 0, vec(10, 20, 30)))
    assert run.action == Action.TX
    assert list(sw.result(run).values) == list(vec(11, 22, 33))


def test_every_drop_reason_has_a_case():
    # busy (a slot another CPU holds) has its own cases: tests/test_xdp_fastpath.py
    assert {reason for reason, _ in DROPS.values()} | {"busy"} == set(wire.DROP_REASONS)


def test_a_job_whose_range_runs_past_the_slot_table_is_bad_slot_there(sw):
    """Defence in depth: the control plane never writes such a range."""
    job = sw.add_job(world=1, slot_base=SLOTS - 2, slot_count=4)
    assert sw.run(sw.data(job, 0, slot=1)).action == Action.TX
    assert sw.run(sw.data(job, 0, slot=2)).action == Action.DROP
    assert sw.counters() == only(rx=2, completed=1, bad_slot=1)


def test_a_cleared_job_is_unknown(sw):
    job = sw.add_job(world=2)
    sw.maps.clear_job(job.id, job.world)
    assert sw.run(sw.data(job, 0)).action == Action.DROP
    assert sw.counters() == only(rx=1, unknown_job=1)


def test_the_source_mac_is_not_checked(sw):
    """docs/design-decisions.md: a rank is its IPv4 address and UDP port."""
    job = sw.add_job(world=1)
    run = sw.run(sw.data(job, 0, src=replace(sw.member(job, 0), mac="02:aa:bb:cc:dd:ee")))
    assert run.action == Action.TX


def test_ethernet_padding_after_the_datagram_is_ignored(sw):
    job = sw.add_job(world=1)
    run = sw.run(sw.data(job, 0, values=vec(7)) + bytes(6))
    assert run.action == Action.TX and sw.result(run).values[0] == 7


def test_one_job_s_rank_cannot_contribute_to_another_job(sw):
    a = sw.add_job(job_id=1, world=2, slot_base=0, slot_count=4)
    b = sw.add_job(job_id=2, world=2, slot_base=4, slot_count=4)
    assert sw.run(sw.data(a, 0, 0, vec(1))).action == Action.DROP
    assert sw.run(sw.data(b, 0, 0, vec(100))).action == Action.DROP
    # b's rank 1 claims to be a's rank 1: its address is not the one registered there.
    assert sw.run(sw.data(a, 1, 0, vec(1000), src=sw.member(b, 1))).action == Action.DROP
    assert list(sw.result(sw.run(sw.data(a, 1, 0, vec(2)))).values) == list(vec(3))
    assert list(sw.result(sw.run(sw.data(b, 1, 0, vec(200)))).values) == list(vec(300))
    assert sw.counters() == only(rx=5, aggregated=2, completed=2, bad_source=1)


# ------------------------------------------------------------ aggregation and completion

@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_a_round_sums_exactly_over_the_whole_int32_range(sw, world):
    rng = np.random.default_rng(world)
    contributions = rng.integers(INT32_MIN, INT32_MAX, size=(world, K), endpoint=True,
                                 dtype=np.int64).astype(np.int32)
    job = sw.add_job(world=world, slot_count=8)
    run = sw.round(job, 5, contributions)
    assert run.action == Action.TX
    np.testing.assert_array_equal(sw.result(run).values, wrapped_sum(contributions))
    assert sw.counters() == only(rx=world, aggregated=world - 1, completed=1)


def test_sums_wrap_around_as_int32(sw):
    job = sw.add_job(world=2)
    a = vec(INT32_MAX, INT32_MIN, -1, INT32_MAX, INT32_MIN)
    b = vec(1, -1, 1, INT32_MAX, INT32_MIN)
    run = sw.round(job, 0, [a, b])
    assert list(sw.result(run).values) == list(vec(INT32_MIN, INT32_MAX, 0, -2, 0))


def test_the_result_goes_to_the_job_s_group_from_the_switch(sw):
    job = sw.add_job(job_id=200, world=3, result_port=40123)
    last = sw.data(job, 2, slot=1, values=vec(3), ver=1, seq=77)
    sw.run(sw.data(job, 0, slot=1, values=vec(1), ver=1, seq=77))
    sw.run(sw.data(job, 1, slot=1, values=vec(2), ver=1, seq=77))
    run = sw.run(last)
    assert run.action == Action.TX
    res = sw.result(run)
    assert res.frame.dst == job.group == Endpoint("01:00:5e:4d:00:c8", "239.77.0.200", 40123)
    assert res.frame.src == sw.switch
    assert res.frame.ip_checksum_ok and res.frame.ttl == 64 and res.frame.udp_checksum == 0
    assert len(run.frame) == len(last)
    assert (res.frame.ip_length, res.frame.udp_length) == (len(last) - 14, len(last) - 34)
    assert (res.version, res.type) == (wire.VERSION, wire.TYPE_RESULT)
    h = res.header
    assert (h["job"], h["slot"], h["seq"], h["count"]) == (200, 1, 77, K)
    assert (h["owner"], h["pace"]) == (0, 0)
    # Not the data key (it stays with the members) but the RESULT's authenticator.
    assert h["key"] != job.key and wire.result_authentic(res.frame.payload, len(res.frame.payload),
                                                        job.result_key, job.auth, 0)
    assert (h["op"], h["fmt"], h["tag"]) == (wire.OP_SUM, wire.FMT_INT32, 0)
    assert h["flags"] == wire.FLAG_SLOT_VER
    assert list(res.values) == list(vec(6))


@pytest.mark.parametrize("ver", [0, 1])
def test_result_flags_are_the_version_and_the_or_of_nonfinite_and_exp_the_max(sw, ver):
    job = sw.add_job(world=3)
    run = sw.round(job, 2, [vec(1)] * 3, ver=ver, exps=[-3, 5, 2],
                   flags=[0, wire.FLAG_NONFINITE, wire.FLAG_RETRANS])
    h = sw.result(run).header
    assert h["flags"] == ver | wire.FLAG_NONFINITE  # RETRANS is not carried over
    assert h["exp"] == 5


def test_exp_is_a_signed_max_and_nonfinite_resets_with_the_round(sw):
    job = sw.add_job(world=2)
    h = sw.result(sw.round(job, 0, [vec(1)] * 2, exps=[-9, -7],
                           flags=[wire.FLAG_NONFINITE, 0])).header
    assert (h["exp"], h["flags"]) == (-7, wire.FLAG_NONFINITE)
    sw.round(job, 0, [vec(1)] * 2, rnd=1)
    h = sw.result(sw.round(job, 0, [vec(1)] * 2, rnd=2, exps=[-128, 126])).header  # version 0 again
    assert (h["exp"], h["flags"]) == (126, 0)


def test_world_of_one_completes_every_packet(sw):
    job = sw.add_job(world=1)
    for i in range(3):
        run = sw.run(sw.data(job, 0, slot=0, values=vec(i), rnd=i))
        assert run.action == Action.TX and sw.result(run).values[0] == i
    assert sw.counters() == only(rx=3, completed=3)


# ------------------------------------------------------------ retransmissions

def test_a_retransmission_to_a_completed_slot_gets_the_result_back_alone(sw):
    job = sw.add_job(world=2)
    done = sw.result(sw.round(job, 3, [vec(1, 2), vec(10, 20)], ver=1,
                              flags=[wire.FLAG_NONFINITE, 0]))
    for rank in (0, 1):
        again = sw.data(job, rank, slot=3, values=vec(99, 99), ver=1, flags=wire.FLAG_RETRANS)
        run = sw.run(again)
        assert run.action == Action.TX
        res = sw.result(run)
        assert res.frame.dst == sw.member(job, rank)  # unicast back to the sender
        assert res.frame.src == sw.switch and res.frame.ip_checksum_ok
        assert res.header["flags"] == (wire.FLAG_SLOT_VER | wire.FLAG_NONFINITE
                                       | wire.FLAG_SHADOW)
        assert (res.type, res.header["exp"], res.header["seq"]) == (wire.TYPE_RESULT,
                                                                   done.header["exp"],
                                                                   done.header["seq"])
        assert res.values.tobytes() == done.values.tobytes()
    assert sw.counters() == only(rx=4, aggregated=1, completed=1, shadow_reply=2)


def test_a_duplicate_to_an_incomplete_slot_is_dropped_and_not_added(sw):
    job = sw.add_job(world=3)
    assert sw.run(sw.data(job, 0, values=vec(1))).action == Action.DROP
    before = sw.slot_bytes()
    dup = sw.data(job, 0, values=vec(1000), flags=wire.FLAG_RETRANS)
    assert sw.run(dup) == (Action.DROP, dup)
    assert sw.slot_bytes() == before
    assert sw.run(sw.data(job, 1, values=vec(2))).action == Action.DROP
    run = sw.run(sw.data(job, 2, values=vec(3)))
    assert list(sw.result(run).values) == list(vec(6))
    assert sw.counters() == only(rx=4, aggregated=2, completed=1, dup_dropped=1)


def test_versions_alternate_over_the_rounds_of_a_slot(sw):
    """Round r of a slot is version r % 2; round r+1 starts in the other
    version, so the old result stays answerable to the ranks that have not
    moved on."""
    job = sw.add_job(world=2)
    previous = None
    for r in range(6):
        ver, a, b = r % 2, vec(r, 100 * r), vec(1000 * r, -r)
        assert sw.run(sw.data(job, 0, 3, a, rnd=r)).action == Action.DROP
        if previous is not None:  # rank 1 is still in round r-1: its result is there for it
            shadow = sw.result(sw.run(sw.data(job, 1, 3, rnd=r - 1, flags=wire.FLAG_RETRANS)))
            assert shadow.header["flags"] == (ver ^ 1) | wire.FLAG_SHADOW
            assert list(shadow.values) == previous
        res = sw.result(sw.run(sw.data(job, 1, 3, b, rnd=r)))
        assert res.header["flags"] == ver
        assert list(res.values) == list(a + b)
        previous = list(a + b)
    assert sw.counters() == only(rx=17, aggregated=6, completed=6, shadow_reply=5)


def test_counters_account_for_every_packet_of_a_mixed_stream(sw):
    job = sw.add_job(world=2)
    frames = [sw.data(job, 0), sw.data(job, 0), sw.data(job, 1), sw.data(job, 1),  # +dup, +shadow
              sw.data(job, 5), sw.data(job, 0, count=1), sw.data(job, 0)[:50],  # drops
              FOREIGN["arp request"](sw), FOREIGN["tcp to the port"](sw)]       # not ours
    assert [sw.run(f).action for f in frames] == [Action.DROP, Action.DROP, Action.TX, Action.TX,
                                                  Action.DROP, Action.DROP, Action.DROP,
                                                  Action.PASS, Action.PASS]
    c = sw.counters()
    assert c == only(rx=7, aggregated=1, dup_dropped=1, completed=1, shadow_reply=1, bad_rank=1,
                     bad_count=1, truncated=1, passed=2)
    assert_accounted(c)


@pytest.mark.parametrize("k, frame_len", [(wire.MTU1500_K, 14 + 1500),
                                          (wire.MAX_K, wire.ETH_LEN + wire.MAX_MTU - 2)])
def test_the_largest_k_that_fits_the_mtu(k, frame_len):
    """k = SWML_MTU1500_K: a 1514-byte frame. k = SWML_MAX_K: the largest frame
    native XDP takes in one page, virtio_net's too (3508 bytes; 858 int32 leave
    2 of them), the program's longest loops; the verifier takes it and the sums
    are exact."""
    require_bpf()
    with SwitchTester(k=k, slots=2) as sw:
        job = sw.add_job(world=2, slot_count=2)
        a = np.arange(k, dtype=np.int32) * 1_000_003 - 7
        b = np.full(k, wire.MAX_K, dtype=np.int32) - 3 * a
        run = sw.round(job, 1, [a, b])
        assert len(run.frame) == frame_len
        np.testing.assert_array_equal(sw.result(run).values, a + b)


# ------------------------------------------------------------ --fanout unicast
