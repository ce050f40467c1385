"""Unit tests of the XDP switch (xdp/swml_switch.c) through BPF_PROG_TEST_RUN:
one crafted frame in, the verdict, the counters it moved and the frame out.
No lab; the program is compiled once for the module. A new data-plane rule
gets its test here first (see tests/xdp_tester.py)."""
from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from switchml_xdp import wire

from frames import Host, data, parse, swml_of, udp_frame
from xdp_tester import SwitchTester, skip_unless_bpf

skip_unless_bpf()

K = 8
SWITCH = Host("02:00:00:00:00:01", "10.0.0.1", wire.DEFAULT_PORT)
WORKERS = [Host(f"02:00:00:00:01:{r:02x}", f"10.0.1.{r + 1}", 40000 + r) for r in range(wire.MAX_WORLD)]
JOB, SLOT_BASE, SLOTS_OF_JOB, RESULT_PORT = 1, 4, 4, 41000


@pytest.fixture(scope="module")
def tester():
    t = SwitchTester(k=K, slots=16)
    yield t
    t.close()


@pytest.fixture
def sw(tester):
    """The switch with one job of two ranks, slots 4..7, nothing aggregated yet."""
    tester.reset()
    tester.add_job(JOB, world=2, slot_base=SLOT_BASE, slot_count=SLOTS_OF_JOB,
                   members=WORKERS[:2], result_port=RESULT_PORT)
    return tester


def contribution(rank: int, values, *, slot: int = 0, job: int = JOB, src: Host | None = None,
                 **hdr) -> bytes:
    """A well-formed DATA frame of `rank` to the switch."""
    return udp_frame(src or WORKERS[rank], SWITCH, data(job, rank, slot, values, **hdr))


def vals(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-2**20, 2**20, K, dtype=np.int32)


# ---------------------------------------------------------------- not ours: passed

@pytest.mark.parametrize("frame", [
    pytest.param(bytes(Ether(src=WORKERS[0].mac, dst="ff:ff:ff:ff:ff:ff")
                       / ARP(psrc=WORKERS[0].ip, pdst=SWITCH.ip)), id="arp"),
    pytest.param(bytes(Ether(src=WORKERS[0].mac, dst=SWITCH.mac) / IP(src=WORKERS[0].ip, dst=SWITCH.ip)
                       / TCP(sport=40000, dport=wire.DEFAULT_CONTROL_PORT)), id="tcp-control"),
    pytest.param(bytes(Ether(src=WORKERS[0].mac, dst=SWITCH.mac) / IP(src=WORKERS[0].ip, dst=SWITCH.ip)
                       / TCP(sport=40000, dport=wire.DEFAULT_PORT)), id="tcp-to-data-port"),
    pytest.param(udp_frame(WORKERS[0], Host(SWITCH.mac, SWITCH.ip, 53), b"dns?"), id="udp-other-port"),
    pytest.param(udp_frame(WORKERS[0], Host(SWITCH.mac, SWITCH.ip, 53), b"x" * 16,
                           options=b"\x01\x01\x01\x00"), id="ip-options-other-port"),
    pytest.param(bytes(Ether(src=WORKERS[0].mac, dst=SWITCH.mac, type=0x86DD) / Raw(b"\x60" + bytes(60))),
                 id="ipv6"),
    # The shortest frame test-run takes: an Ethernet header saying IPv4, and no IPv4 header.
    pytest.param(bytes(Ether(src=WORKERS[0].mac, dst=SWITCH.mac, type=0x0800)), id="ipv4-without-header"),
])
def test_not_ours_is_passed(sw, frame):
    run = sw.run(frame)
    assert run.action == "pass"
    assert run.counted == {"passed"}
    assert run.frame == frame


# ---------------------------------------------------------------- dropped, by reason

def _bad(reason: str) -> bytes:
    """One frame dropped for `reason`, for every SWML_CNT_* drop reason of
    swml_wire.h: a new reason fails here (KeyError) until it has its frame."""
    good = contribution(0, vals(0))
    return {
        "truncated": lambda: good[:-4],  # the payload cut short, lengths as sent
        "bad_ip": lambda: udp_frame(WORKERS[0], SWITCH, data(JOB, 0, 0, vals(0)), flags="MF"),
        "bad_version": lambda: _with_hdr(good, ver_type=((wire.VERSION + 1) << 4) | wire.TYPE_DATA),
        "bad_type": lambda: _with_hdr(good, ver_type=wire.ver_type(wire.TYPE_RESULT)),
        "unknown_job": lambda: contribution(0, vals(0), job=JOB + 1),
        "bad_rank": lambda: contribution(2, vals(0), src=WORKERS[0]),
        "bad_source": lambda: contribution(0, vals(0), src=Host(WORKERS[0].mac, WORKERS[0].ip, 39999)),
        "bad_slot": lambda: contribution(0, vals(0), slot=SLOTS_OF_JOB),
        "bad_count": lambda: udp_frame(WORKERS[0], SWITCH, data(JOB, 0, 0, np.zeros(K - 1, np.int32))),
    }[reason]()


def _with_hdr(frame: bytes, **fields) -> bytes:
    """`frame` with swml header fields replaced (lengths and checksums unchanged)."""
    at = len(frame) - wire.HDR_LEN - 4 * K
    hdr = wire.unpack_header(frame[at:]).copy()
    for name, value in fields.items():
        hdr[name] = value
    return frame[:at] + hdr.tobytes() + frame[at + wire.HDR_LEN:]


# More ways to be each reason than _bad's one.
EXTRA_BAD = {
    "truncated: header cut": lambda: contribution(0, vals(0))[:wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN + 4],
    "bad_ip: options to our port": lambda: udp_frame(WORKERS[0], SWITCH, data(JOB, 0, 0, vals(0)),
                                                     options=b"\x01\x01\x01\x00"),
    "bad_ip: fragment offset": lambda: udp_frame(WORKERS[0], SWITCH, data(JOB, 0, 0, vals(0)), frag=8),
    "bad_ip: ip length": lambda: udp_frame(WORKERS[0], SWITCH, data(JOB, 0, 0, vals(0)) + b"\0" * 4),
    "bad_source: address": lambda: contribution(0, vals(0), src=Host(WORKERS[0].mac, "10.0.9.9", WORKERS[0].port)),
    "bad_source: another rank's": lambda: contribution(1, vals(0), src=WORKERS[0]),
    "bad_count: right length, wrong count": lambda: _with_hdr(contribution(0, vals(0)), count=K + 1),
}


@pytest.mark.parametrize("reason, make", [*((r, lambda r=r: _bad(r)) for r in wire.DROP_REASONS),
                                          *((name.split(":")[0], make) for name, make in EXTRA_BAD.items())],
                         ids=[*wire.DROP_REASONS, *EXTRA_BAD])
def test_drop_reason(sw, reason, make):
    slots_before = [sw.slot_bytes(i) for i in range(sw.slots)]
    run = sw.run(make())
    assert run.action == "drop"
    assert run.counted == {"rx", reason}
    assert [sw.slot_bytes(i) for i in range(sw.slots)] == slots_before, "a dropped frame touched a slot"
    # And the slot still aggregates exactly afterwards.
    assert sw.run(contribution(0, vals(1))).action == "drop"
    _, got = swml_of(sw.run(contribution(1, vals(2))).frame)
    np.testing.assert_array_equal(got, vals(1) + vals(2))


# ---------------------------------------------------------------- aggregation and completion

@pytest.mark.parametrize("world", [2, 3, 5, wire.MAX_WORLD])
def test_aggregation_of_world_ranks(tester, world):
    tester.reset()
    tester.add_job(JOB, world=world, slot_base=0, slot_count=2, members=WORKERS[:world],
                   result_port=RESULT_PORT)
    inputs = [vals(10 + r) for r in range(world)]
    for r in range(world - 1):
        run = tester.run(contribution(r, inputs[r], slot=1))
        assert (run.action, run.counted) == ("drop", {"rx", "aggregated"})
    run = tester.run(contribution(world - 1, inputs[-1], slot=1))
    assert (run.action, run.counted) == ("tx", {"rx", "completed"})
    _, got = swml_of(run.frame)
    np.testing.assert_array_equal(got, np.sum(inputs, axis=0, dtype=np.int32))


def test_sums_wrap_as_int32(sw):
    big = np.full(K, 2**31 - 1, np.int32)
    sw.run(contribution(0, big))
    _, got = swml_of(sw.run(contribution(1, big)).frame)
    np.testing.assert_array_equal(got, np.full(K, -2, np.int32))


def _fresh_checksum(ip: IP) -> int:
    """The IPv4 header checksum scapy computes for `ip`'s header fields."""
    fresh = IP(bytes(ip))
    fresh.chksum = None
    return IP(bytes(fresh)).chksum


def test_completion_is_a_result_to_the_group(sw):
    sw.run(contribution(0, vals(1), slot=2, seq=77, exp=3))
    run = sw.run(contribution(1, vals(2), slot=2, seq=77, exp=5, flags=wire.FLAG_NONFINITE))
    assert run.action == "tx"
    pkt = parse(run.frame)
    group_ip, group_mac = wire.group_of_job(JOB)
    assert (pkt[Ether].src, pkt[Ether].dst) == (SWITCH.mac, group_mac)
    assert (pkt[IP].src, pkt[IP].dst, pkt[IP].ttl) == (SWITCH.ip, group_ip, 64)
    assert (pkt[UDP].sport, pkt[UDP].dport, pkt[UDP].chksum) == (SWITCH.port, RESULT_PORT, 0)
    assert pkt[IP].chksum == _fresh_checksum(pkt[IP])
    hdr, got = swml_of(run.frame)
    assert hdr["ver_type"] == wire.ver_type(wire.TYPE_RESULT)
    assert hdr["flags"] == wire.FLAG_NONFINITE  # version 0, not a shadow reply
    assert (hdr["exp"], hdr["seq"], hdr["job"], hdr["slot"], hdr["count"]) == (5, 77, JOB, 2, K)
    np.testing.assert_array_equal(got, vals(1) + vals(2))


def test_result_carries_the_slot_version(sw):
    sw.run(contribution(0, vals(1), flags=wire.FLAG_SLOT_VER))
    hdr, _ = swml_of(sw.run(contribution(1, vals(2), flags=wire.FLAG_SLOT_VER)).frame)
    assert hdr["flags"] == wire.FLAG_SLOT_VER


# ---------------------------------------------------------------- retransmissions

def test_retransmission_to_a_complete_slot_gets_a_shadow_reply(sw):
    sw.run(contribution(0, vals(1), exp=2))
    sw.run(contribution(1, vals(2), exp=4))
    run = sw.run(contribution(0, vals(9), exp=1, flags=wire.FLAG_RETRANS))
    assert (run.action, run.counted) == ("tx", {"rx", "shadow_reply"})
    pkt = parse(run.frame)
    assert (pkt[Ether].src, pkt[Ether].dst) == (SWITCH.mac, WORKERS[0].mac)
    assert (pkt[IP].src, pkt[IP].dst) == (SWITCH.ip, WORKERS[0].ip)
    assert (pkt[UDP].sport, pkt[UDP].dport) == (SWITCH.port, WORKERS[0].port)
    hdr, got = swml_of(run.frame)
    assert hdr["flags"] == wire.FLAG_SHADOW and hdr["exp"] == 4
    np.testing.assert_array_equal(got, vals(1) + vals(2))  # the stored result, not the resent values


def test_duplicate_to_an_incomplete_slot_is_dropped(tester):
    tester.reset()
    tester.add_job(JOB, world=3, slot_base=0, slot_count=1, members=WORKERS[:3], result_port=RESULT_PORT)
    tester.run(contribution(0, vals(1)))
    run = tester.run(contribution(0, vals(1), flags=wire.FLAG_RETRANS))
    assert (run.action, run.counted) == ("drop", {"rx", "dup_dropped"})
    tester.run(contribution(1, vals(2)))
    _, got = swml_of(tester.run(contribution(2, vals(3))).frame)
    np.testing.assert_array_equal(got, vals(1) + vals(2) + vals(3))  # counted once


def test_versions_alternate(sw):
    """Round i uses version i % 2; a rank's contribution to one version clears
    it from the other, so round 3 on version 0 starts afresh."""
    for rnd in range(4):
        ver = rnd % 2
        a, b = vals(100 + rnd), vals(200 + rnd)
        first = sw.run(contribution(0, a, flags=ver, seq=rnd))
        assert first.counted == {"rx", "aggregated"}, f"round {rnd}"
        hdr, got = swml_of(sw.run(contribution(1, b, flags=ver, seq=rnd)).frame)
        assert hdr["flags"] == ver and hdr["seq"] == rnd
        np.testing.assert_array_equal(got, a + b)
