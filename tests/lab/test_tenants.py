"""Reliability, isolation: four tenants on one switch, all
exact, and crafted packets from one job aimed at another that change
nothing. All tests share the session's lab (8 workers) and switch
(conftest.py) and compare counters as deltas."""
from __future__ import annotations

import itertools
import socket
import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from crafted_packets import ip_bytes, send_paced, to_switch, udp_socket
from frames import endpoint
from reliability_helpers import (
    PORT,
    K,
    StreamingJob,
    cdelta,
    job_name,
    link_drops,
    outcome_sum,
    report,
    settle,
    switch_counters,
    upstream_drops,
)
from switchml_xdp import wire
from switchml_xdp.lab.cluster import run_ranks
from xdp_tester import SwitchOracle


@pytest.mark.timeout(90)
def test_four_concurrent_jobs_all_exact(lab8, switch):
    """Four jobs at once; A and B share host w1 (same IP, different ports)."""
    jobs = [StreamingJob(lab8, [lab8.workers[i] for i in idx], job_name(tag), port, seed, min_calls=4)
            for tag, idx, port, seed in [("iso-a", (0, 1), 48881, 1), ("iso-b", (1, 2, 3), 48882, 2),
                                         ("iso-c", (4, 5), 48883, 3), ("iso-d", (6, 7), 48884, 4)]]
    c0, d0 = switch_counters(switch), link_drops(lab8)
    t0 = time.monotonic()
    for j in jobs:
        j.start()
    for j in jobs:
        j.wait_streaming()
    for j in jobs:
        j.stop()
    elapsed = time.monotonic() - t0
    for j in jobs:
        j.check_exact()
    sent = sum(j.packets_sent() for j in jobs)
    settle(lambda: cdelta(c0, switch_counters(switch))["rx"] == sent)
    c = cdelta(c0, switch_counters(switch))
    drops = upstream_drops(lab8, d0, link_drops(lab8), lab8.workers)
    assert len({j.info.job_id for j in jobs}) == 4
    ranges = sorted((j.info.job_id, j.info.slots) for j in jobs)
    assert c["completed"] == sum(j.npackets for j in jobs), c
    assert c["completed"] + c["aggregated"] == sum(j.world * j.npackets for j in jobs), c
    assert c["rx"] == outcome_sum(c), c
    assert not any(c[r] for r in wire.DROP_REASONS), c
    # Everything the workers sent arrived, but for frames a veth dropped
    # (measured: 9 workers start their windows at once, and under load a
    # NAPI ring of 256 can fill); each of those was sent again.
    assert 0 <= sent - c["rx"] <= sum(drops.values()), (sent, c, drops)
    assert c["shadow_reply"] + c["dup_dropped"] == \
        c["rx"] - sum(j.world * j.npackets for j in jobs), c
    report("four concurrent jobs", seconds=f"{elapsed:.2f}", calls=[j.calls for j in jobs],
           jobs_and_slots=ranges, retransmissions=sum(j.retransmissions() for j in jobs),
           veth_drops=drops)


@pytest.mark.timeout(90)
def test_crafted_packets_from_another_job_change_nothing(lab8, switch):
    """Job A (w0, w1 on port PA; hand-driven sockets) attacks job B (w1, w2, w3
    on port PB; real workers) while B streams: every rank, every slot of B's
    range and two beyond it, both versions, with and without the
    retransmission flag, from A's rank 0 (another host) and from A's rank 1,
    which is B's rank 0 too (same IP, A's port); with A's data key (what a
    tenant has) and with B's (as a leak would give it). All dropped before any
    slot is touched: bad_key without B's key; with it, bad_rank for ranks >=
    B's world, bad_source for the others."""
    from switchml_xdp.client.control import ControlClient

    PA, PB = 48885, 48886
    hosts_a = lab8.workers[:2]
    peers = [udp_socket(lab8, h, PA) for h in hosts_a]
    name_a = job_name("victim-a")

    def join_a(rank, host):
        c = ControlClient(lab8.switch.ip)
        return c, c.join(name_a, 2, rank, host.ip, PA, host.mac, timeout=20)

    joined_a = run_ranks(lab8, hosts_a, join_a, timeout=40)
    info_a = joined_a[0][1]
    job_b = StreamingJob(lab8, lab8.workers[1:4], job_name("victim-b"), PB, seed=9, min_calls=3,
                         size_packets=60)
    dest = (lab8.switch.ip, PORT)
    try:
        c0, d0 = switch_counters(switch), link_drops(lab8)
        job_b.start()
        job_b.wait_streaming()
        info_b = job_b.info
        assert info_b.job_id != info_a.job_id
        with SwitchOracle(switch.iface) as oracle:
            evil = np.full(K, 0x01010101, np.int32)
            key_b = oracle.jobs[info_b.job_id][0].key
            sends, expect = [], {}
            for peer, host in zip(peers, hosts_a):
                for rank in (0, 1, 2, 3, 63, 64, 65535):
                    for slot in [*range(info_b.slots), info_b.slots, 65535]:
                        for flags, key in itertools.product(
                                (0, wire.FLAG_SLOT_VER, wire.FLAG_RETRANS,
                                 wire.FLAG_SLOT_VER | wire.FLAG_RETRANS), (info_a.key, key_b)):
                            d = wire.datagram(wire.TYPE_DATA, info_b.job_id, rank, slot, slot, evil,
                                              flags=flags, exp=100, key=key)
                            why = oracle.outcome(to_switch(lab8, endpoint(host, PA), d))
                            if key != key_b:
                                assert why == "bad_key"
                            elif host == lab8.workers[1] and rank == 0:
                                assert why == "bad_source"   # B's rank 0's own IP, A's port
                            expect[why] = expect.get(why, 0) + 1
                            sends.append((peer, [d], False, True))
        assert set(expect) == {"bad_key", "bad_rank", "bad_source"}, expect
        repeated, attack_s, pacer = send_paced(switch, sends, dest, job_b.live_packets_sent)
        assert not job_b.results, "B must still be streaming when the attack ends"
        # A's own slots are untouched too: one exact round on A's slot 3.
        v = np.arange(K, dtype=np.int32)
        for peer, host in zip(peers, hosts_a):
            peer.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                            ip_bytes(info_a.group_ip) + ip_bytes(host.ip))
        for r, peer in enumerate(peers):
            peer.sendto(wire.datagram(wire.TYPE_DATA, info_a.job_id, r, 3, 77, (r + 1) * v,
                                      key=info_a.key), dest)
        for peer in peers:
            peer.settimeout(5)
            got = peer.recv(4096)
            assert wire.unpack_header(got)["seq"] == 77
            np.testing.assert_array_equal(np.frombuffer(got, "<i4", offset=wire.HDR_LEN), 3 * v)
        job_b.stop()
    finally:
        job_b._stop.set()
        for c, _ in joined_a:
            c.leave()
            c.close()
        for p in peers:
            p.close()
    job_b.check_exact()
    n_attack = len(sends)
    settle(lambda: cdelta(c0, switch_counters(switch))["rx"] == n_attack + 2 + job_b.packets_sent())
    c = cdelta(c0, switch_counters(switch))
    # The attackers' own veths may refuse a frame (ENOBUFS, sent again); any
    # other drop on the way to the switch would make the counts below inexact.
    drops = upstream_drops(lab8, d0, link_drops(lab8), lab8.workers[:4])
    assert sum(drops.values()) == repeated.get("ENOBUFS", 0), \
        f"frames dropped by a veth on the way to the switch (see Pacer): {drops}"
    for reason in wire.DROP_REASONS:
        assert c[reason] == expect.get(reason, 0), (reason, c, expect)
    # Only B's workers (and A's one valid round) reached a slot.
    assert c["completed"] == job_b.npackets + 1, c
    assert c["aggregated"] == (job_b.world - 1) * job_b.npackets + 1, c
    assert c["shadow_reply"] + c["dup_dropped"] == job_b.retransmissions(), c
    assert c["rx"] == n_attack + 2 + job_b.packets_sent() == outcome_sum(c), c
    report("cross-job attack", packets=n_attack, seconds=f"{attack_s:.2f}", repeated=repeated,
           pacer_waits=pacer.waits, b_calls=job_b.calls, **expect)
