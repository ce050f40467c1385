"""Reliability, fuzzing: more than 100k random and mutated
packets at the switch while a valid job streams, every one of them
accounted for."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from crafted_packets import PAYLOAD_LEN, eth_ip_udp, raw_socket, send_paced, to_switch, udp_socket
from frames import Endpoint
from reliability_helpers import (
    OUTCOMES,
    PORT,
    K,
    StreamingJob,
    cdelta,
    int_tensor,
    job_name,
    link_drops,
    outcome_sum,
    quiet_reading,
    report,
    settle,
    switch_counters,
    upstream_drops,
    wrap_sum,
)
from switchml_xdp import wire
from switchml_xdp.lab import netns
from switchml_xdp.lab.cluster import run_ranks
from xdp_tester import SwitchOracle, job_snapshot

FIELDS = list(wire.HDR_DTYPE.names)  # the swml header fields a fuzz case corrupts
NOT_RX = ("passed", "other_host")   # verdicts of frames the switch does not count as its own
SLOT_STATE = ("stale",)              # drop reasons that depend on a slot's state (not predicted)
RAW_FIELDS = {  # offset, size of the Ethernet/IPv4/UDP fields a raw frame corrupts
    "ethertype": (12, 2), "ver_ihl": (14, 1), "tos": (15, 1), "tot_len": (16, 2), "id": (18, 2),
    "frag_off": (20, 2), "ttl": (22, 1), "protocol": (23, 1), "ip_check": (24, 2),
    "saddr": (26, 4), "daddr": (30, 4), "sport": (34, 2), "dport": (36, 2),
    "udp_len": (38, 2), "udp_check": (40, 2)}
N_FIELD = 3000          # per field, V and F:            9 x 2 x 3000 = 54,000
N_RANDOM = 25_000       # random bytes, random length:                  25,000
N_RAW_FIELD = 1000      # per raw field and base:       15 x 2 x 1000 = 30,000
                        # + truncations at every offset: 2 x 1041 kernel, 2 x 1069 raw


def headers(rng, n: int, job: int, ranks, slots: int, key: int) -> np.ndarray:
    """n valid DATA headers of a job with data key `key` (random slot in range,
    seq, exp, version flag, op, tag) as an (n, HDR_LEN) byte matrix."""
    h = np.zeros(n, wire.HDR_DTYPE)
    h["ver_type"], h["flags"], h["job"], h["rank"] = wire.ver_type(wire.TYPE_DATA), \
        rng.integers(4, size=n), job, ranks
    h["slot"], h["seq"] = rng.integers(slots, size=n), rng.integers(2**32, size=n, dtype=np.uint64)
    h["exp"], h["count"], h["key"] = rng.integers(-20, 20, size=n), K, key
    h["op"], h["tag"] = rng.integers(wire.OP_NUM, size=n), rng.integers(3, size=n)
    return np.frombuffer(h.tobytes(), np.uint8).reshape(n, wire.HDR_LEN).copy()


def corrupt(rng, rows: np.ndarray, off: int, size: int) -> None:
    """Corrupt the big-endian field rows[:, off:off+size] of every row: a random
    value, the valid one with one bit flipped, or an edge (0, all ones, +-1)."""
    n, top = rows.shape[0], (1 << 8 * size) - 1
    shifts = np.arange(size - 1, -1, -1, dtype=np.uint64) * np.uint64(8)
    v = (rows[:, off:off + size].astype(np.uint64) << shifts).sum(axis=1, dtype=np.uint64)
    flip = v ^ (np.uint64(1) << rng.integers(8 * size, size=n).astype(np.uint64))
    edges = np.stack([np.zeros(n, np.uint64), np.full(n, top, np.uint64),
                      (v + np.uint64(1)) & np.uint64(top), (v - np.uint64(1)) & np.uint64(top)])
    edge = edges[rng.integers(4, size=n), np.arange(n)]
    rand = rng.integers(0, top + 1, size=n, dtype=np.uint64)
    pick = rng.integers(4, size=n)
    new = np.where(pick == 0, flip, np.where(pick == 1, edge, rand))
    for b, shift in enumerate(shifts):
        rows[:, off + b] = (new >> shift) & np.uint64(0xFF)


@pytest.mark.timeout(120)
def test_fuzz_switch_keeps_working_and_accounts_for_every_packet(lab8, switch):
    """More than 100k bad, random and mutated packets at the switch while a
    valid 4-worker job streams. Senders: a job F whose two ranks are our own
    sockets (w4, w5), so mutations that keep a valid header reach its slots
    and the lock path; a non-member socket on w6 (mutations of the valid job
    V's packets, random bytes); a raw socket on w7 (corrupted Ethernet/IPv4/UDP
    headers, frames cut at every offset). The stranger and the raw socket use
    the jobs' real data keys: the checks behind the key must hold where a key
    has leaked. The switch program itself, run on each packet's frame with a
    copy of the switch's jobs (SwitchOracle), predicts whether it counts as rx
    and why it is dropped.

    Exact accounting needs every frame we count as sent to reach the switch
    program: a kernel UDP socket or a raw socket reports a frame its own veth
    could not queue (ENOBUFS, with IP_RECVERR for UDP) and we send it again;
    the only other place a frame can vanish is the bridge's port to the
    switch, whose tx_dropped must stay 0 (measured, not assumed). Should it
    move, the test fails saying so rather than loosening the count."""
    from switchml_xdp import Worker
    from switchml_xdp.client.control import ControlClient

    w = lab8.workers
    PV, PF, PX = 48890, 48891, 40123
    rng = np.random.default_rng(2024)
    sock_f = [udp_socket(lab8, w[4], PF), udp_socket(lab8, w[5], PF)]
    sock_x = udp_socket(lab8, w[6], PX)
    raw = raw_socket(lab8, w[7])
    for s in sock_f:                       # shadow replies come back: never block on them
        s.setblocking(False)
    name_f = job_name("fuzz-f")

    def join_f(rank, host):
        c = ControlClient(lab8.switch.ip)
        return c, c.join(name_f, 2, rank, host.ip, PF, host.mac, timeout=20)

    joined_f = run_ranks(lab8, w[4:6], join_f, timeout=40)
    info_f = joined_f[0][1]
    valid = StreamingJob(lab8, w[:4], job_name("fuzz-v"), PV, seed=31, min_calls=2, size_packets=60)
    dest = (lab8.switch.ip, PORT)
    oracle = None
    try:
        valid.start(gate=False)
        assert valid.joined.wait(60) and valid.info, "the valid job did not join"
        info_v = valid.info
        oracle = SwitchOracle(switch.iface)
        assert info_v.job_id in oracle.jobs and info_f.job_id in oracle.jobs

        # --- build every packet, and what the switch must do with it -------------
        t_build = time.monotonic()
        payload = np.arange(K, dtype="<i4").tobytes()
        sends, expect = [], {}

        def expect_(why) -> bool:
            """Count the switch's verdict; True if the frame counts as rx."""
            expect[why] = expect.get(why, 0) + 1
            return why not in NOT_RX

        def datagram(src: Endpoint, data: bytes) -> bool:
            return expect_(oracle.outcome(to_switch(lab8, src, data)))

        key_v = oracle.jobs[info_v.job_id][0].key  # V's key, as a leak would give it
        bases = [  # (socket, its address, job, ranks it sends as, slots of the job, key)
            (sock_x, Endpoint(w[6].mac, w[6].ip, PX), info_v.job_id,
             lambda n: rng.integers(info_v.world, size=n), info_v.slots, key_v),
            (sock_f[0], Endpoint(w[4].mac, w[4].ip, PF), info_f.job_id,
             lambda n: np.zeros(n, int), info_f.slots, info_f.key),
            (sock_f[1], Endpoint(w[5].mac, w[5].ip, PF), info_f.job_id,
             lambda n: np.ones(n, int), info_f.slots, info_f.key),
        ]
        # 1. valid headers with one field corrupted (V's from a stranger, F's from its members)
        for field in FIELDS:
            off, size = wire.HDR_DTYPE.fields[field][1], wire.HDR_DTYPE.fields[field][0].itemsize
            for (sock, src, job, ranks, slots, key), n in zip(bases, (N_FIELD, N_FIELD // 2,
                                                                         N_FIELD - N_FIELD // 2)):
                rows = headers(rng, n, job, ranks(n), slots, key)
                corrupt(rng, rows, off, size)
                blob = rows.tobytes()
                for i in range(0, len(blob), wire.HDR_LEN):
                    h = blob[i:i + wire.HDR_LEN]
                    sends.append((sock, [h, payload], False, datagram(src, h + payload)))
        # 2. random bytes of random length (short ones more often), any socket
        for i in range(N_RANDOM):
            sock, src, *_ = bases[i % 3]
            n = int(rng.integers(0, 65 if i % 2 else 1473))
            data = rng.bytes(n)
            if i % 7 == 0 and n >= 1:      # a valid version/type nibble now and then
                data = bytes([wire.ver_type(wire.TYPE_DATA)]) + data[1:]
            sends.append((sock, [data], False, datagram(src, data)))
        # 3. a valid datagram cut at every offset 0..HDR+4k (the last one whole), and padded
        for sock, src, job, ranks, slots, key in bases[:2]:
            whole = headers(rng, 1, job, ranks(1), slots, key).tobytes() + payload
            for n in [*range(PAYLOAD_LEN + 1), PAYLOAD_LEN + 1, PAYLOAD_LEN + 4, PAYLOAD_LEN + 100]:
                data = (whole + bytes(100))[:n]
                sends.append((sock, [data], False, datagram(src, data)))
        # 4. raw frames: one Ethernet/IPv4/UDP field corrupted; V's packet from w7 and
        #    F's rank-0 packet with w4's address forged, both from w7's interface
        raw_bases = [(w[7].ip, PX, info_v.job_id, 1, info_v.slots, key_v),
                     (w[4].ip, PF, info_f.job_id, 0, info_f.slots, info_f.key)]
        for src_ip, sport, job, rank, slots, key in raw_bases:
            ip_udp = np.frombuffer(bytes(eth_ip_udp(lab8, w[7], src_ip, sport, PAYLOAD_LEN)), np.uint8)
            for off, size in RAW_FIELDS.values():
                rows = np.hstack([np.tile(ip_udp, (N_RAW_FIELD, 1)),
                                  headers(rng, N_RAW_FIELD, job, rank, slots, key)])
                corrupt(rng, rows, off, size)
                blob, width = rows.tobytes(), rows.shape[1]
                for i in range(0, len(blob), width):
                    head = blob[i:i + width]
                    sends.append((raw, [head, payload], True,
                                  expect_(oracle.outcome(head + payload))))
        # 5. raw frames cut at every offset from the Ethernet header on
        for src_ip, sport, job, rank, slots, key in raw_bases:
            whole = bytes(eth_ip_udp(lab8, w[7], src_ip, sport, PAYLOAD_LEN)) + \
                headers(rng, 1, job, rank, slots, key).tobytes() + payload
            for n in range(14, len(whole) + 1):
                sends.append((raw, [whole[:n]], True, expect_(oracle.outcome(whole[:n]))))
        order = rng.permutation(len(sends))
        sends = [sends[i] for i in order]
        build_s = time.monotonic() - t_build
        n_rx = sum(v for k, v in expect.items() if k not in NOT_RX)
        assert len(sends) >= 100_000 and n_rx >= 100_000, (len(sends), expect)

        # --- send them while V streams ----------------------------------------
        x0, c0 = quiet_reading(lab8, switch)
        d0 = link_drops(lab8)
        valid.gate.set()
        valid.wait_streaming()
        repeated, send_s, pacer = send_paced(switch, sends, dest, valid.live_packets_sent)
        assert not valid.results, "the valid job must still be streaming when the fuzz ends"
        assert job_snapshot(switch.iface) == oracle.jobs, "the jobs changed under the oracle"
        valid.stop()
    finally:
        if oracle:
            oracle.close()
        valid._stop.set()
        valid.gate.set()
        for c, _ in joined_f:
            c.leave()
            c.close()
        for s in (*sock_f, sock_x, raw):
            s.close()
    valid.check_exact()

    def accounted():
        return cdelta(c0, switch_counters(switch))["rx"] == n_rx + valid.packets_sent()

    settle(accounted)
    drops = upstream_drops(lab8, d0, link_drops(lab8), w[:4])
    # Every frame the switch program saw is counted once, as rx or as passed;
    # read when nothing but background (ARP, TCP) moves.
    x1, c1 = quiet_reading(lab8, switch)
    c = cdelta(c0, c1)
    assert not drops, f"frames dropped by a veth on the way to the switch: {drops}"
    assert x1 - x0 == c["rx"] + c["passed"] + c["other_host"], (x1 - x0, c)
    assert c["rx"] == outcome_sum(c), c
    assert c["rx"] == n_rx + valid.packets_sent(), (c["rx"], n_rx, valid.packets_sent(), expect)
    for reason in (*wire.DROP_REASONS, "other_host"):
        if reason not in SLOT_STATE:
            assert c[reason] == expect.get(reason, 0), (reason, c, expect)
    assert sum(c[k] for k in (*OUTCOMES, *SLOT_STATE)) == \
        expect.get("accepted", 0) + valid.packets_sent(), (c, expect)
    report("fuzz", packets=len(sends), rx=n_rx, build_s=f"{build_s:.2f}", send_s=f"{send_s:.2f}",
           pps=int(len(sends) / send_s), repeated=repeated, pacer_waits=pacer.waits,
           pacer_peak=pacer.peak,
           pacer_gave_up=pacer.gave_up, valid_calls=valid.calls,
           **{k: v for k, v in sorted(expect.items())})

    # --- the switch is still attached and serving --------------------------------
    assert switch.proc.poll() is None, "the switch daemon died"
    link = json.loads(netns.run_in(lab8.switch.ns, ["ip", "-j", "-d", "link", "show",
                                                    switch.iface], capture_output=True,
                                   text=True).stdout)[0]
    assert "xdp" in link and link["xdp"]["prog"]["name"] == "swml_switch", link.get("xdp")
    name = job_name("after-fuzz")
    xs = [int_tensor([77, r], 3 * K + 1) for r in range(2)]

    def fresh(rank, host):
        with Worker(lab8.switch.ip, name, rank, 2, backend="udp", verbose=False) as wk:
            return wk.allreduce(xs[rank].copy())

    for out in run_ranks(lab8, w[6:8], fresh, timeout=60):
        np.testing.assert_array_equal(out, wrap_sum(xs))
