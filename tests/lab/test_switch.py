"""The XDP switch end to end: real program, real namespaces, udp reference workers.

Every test uses its own job name on one shared switch (see conftest.py), and
checks counters as deltas so tests do not depend on each other's traffic.
Tests of the protocol itself (`on_switch`) run on both data planes: the XDP
switch, and the same daemon with --dataplane userspace in a lab of its own.
"""
from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from frames import endpoint, udp_frame
from requires import NO_LAB
from switch_peer import Peer, data
from switchml_xdp import wire
from switchml_xdp.lab.cluster import SwitchProcess, run_ranks
from switchml_xdp.switch.maps import SwitchMaps

K = wire.DEFAULT_K
_names = itertools.count()


def job_name(tag: str) -> str:
    return f"{tag}-{next(_names)}"


@pytest.fixture(scope="module")
def userspace_switch():
    """The daemon with the user-space data plane, in a 4-worker lab of its own
    (one `up` an interface: the session's XDP switch holds lab8's)."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab

    with Lab(workers=4) as lab:
        with SwitchProcess(lab, ["--dataplane", "userspace", "--lease", "2"]) as sw:
            yield lab, sw
        assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])


@pytest.fixture(params=["xdp", "userspace"])
def on_switch(request):
    """(lab, switch process) of each data plane."""
    if request.param == "xdp":
        return request.getfixturevalue("lab8"), request.getfixturevalue("switch")
    return request.getfixturevalue("userspace_switch")


def counters(sw) -> dict:
    """From the XDP switch's pinned maps; else through the control protocol."""
    if not SwitchMaps.exist(sw.iface):
        with sw.lab.enter(sw.lab.switch):
            conn = socket.create_connection((sw.lab.switch.ip, wire.DEFAULT_CONTROL_PORT), timeout=5)
        with conn, conn.makefile() as f:
            conn.sendall(b'{"op": "status"}\n')
            return json.loads(f.readline())["counters"]
    maps = SwitchMaps(sw.iface)
    try:
        return maps.read_counters()
    finally:
        maps.close()


def delta(before: dict, after: dict) -> dict:
    """What changed, without `passed` (heartbeats and ARP pass all the time)."""
    return {k: after[k] - before[k] for k in after if after[k] != before[k] and k != "passed"}


def wrap_sum(arrays) -> np.ndarray:
    """The int32 sum with two's-complement wrap-around, as the switch adds."""
    return np.sum(np.stack(arrays).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


def reduce_on_lab(lab, sw, world, tensors_per_call, job, port=wire.DEFAULT_PORT, hosts=None):
    """Each rank reduces its tensors in order on one job; returns outputs[rank][call]."""
    from switchml_xdp import Worker

    hosts = hosts or lab.workers[:world]

    def rank_body(rank, host):
        with Worker(lab.switch.ip, job, rank, world, backend="udp", port=port, verbose=False) as w:
            outs = []
            for call in tensors_per_call:
                a = call[rank].copy()
                assert w.allreduce(a) is a
                outs.append(a)
            return outs

    return run_ranks(lab, hosts, rank_body)


def random_int32(rng, n, world):
    return [rng.integers(-2**31, 2**31, size=n, dtype=np.int64).astype(np.int32) for _ in range(world)]


@pytest.mark.parametrize("on_switch, world", [("xdp", 1), ("xdp", 2), ("xdp", 4), ("xdp", 8),
                                               ("userspace", 1), ("userspace", 4)],
                         indirect=["on_switch"])
def test_int32_exact_for_lengths_not_multiple_of_k(on_switch, world):
    lab, switch = on_switch
    rng = np.random.default_rng(world)
    lengths = [1, K - 1, K + 1, 3 * K + 17, 40 * K + 3]
    calls = [random_int32(rng, n, world) for n in lengths]
    before = counters(switch)
    outs = reduce_on_lab(lab, switch, world, calls, job_name("exact"))
    for c, call in enumerate(calls):
        expect = wrap_sum(call)
        for rank in range(world):
            np.testing.assert_array_equal(outs[rank][c], expect, err_msg=f"call {c} rank {rank}")
    d = delta(before, counters(switch))
    packets = sum(-(-n // K) for n in lengths)
    assert d.get("completed", 0) == packets  # exactly one RESULT a packet index
    assert not any(d.get(r) for r in wire.DROP_REASONS), d


def test_twenty_calls_alternate_versions(on_switch):
    """20 calls on one job: packet indices run on across calls, so slots are
    reused with alternating versions at every offset of the window."""
    lab, switch = on_switch
    world, rng = 3, np.random.default_rng(7)
    sizes = [int(rng.integers(1, 70 * K)) for _ in range(20)]
    calls = [random_int32(rng, n, world) for n in sizes]
    outs = reduce_on_lab(lab, switch, world, calls, job_name("twenty"))
    for c, call in enumerate(calls):
        for rank in range(world):
            np.testing.assert_array_equal(outs[rank][c], wrap_sum(call))
    assert sum(-(-n // K) for n in sizes) > 2 * 128, "the calls must wrap the window twice"


def test_two_concurrent_jobs_on_one_switch(lab8, switch):
    """Two jobs at once on the same hosts (different UDP ports), both exact."""
    rng = np.random.default_rng(11)
    jobs = [(job_name("conc-a"), 48864, [random_int32(rng, 9000, 4) for _ in range(3)]),
            (job_name("conc-b"), 48870, [random_int32(rng, 7001, 4) for _ in range(3)])]
    results = {}

    def run(name, port, calls):
        results[name] = reduce_on_lab(lab8, switch, 4, calls, name, port=port)

    threads = [threading.Thread(target=run, args=j) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for name, _, calls in jobs:
        for c, call in enumerate(calls):
            for rank in range(4):
                np.testing.assert_array_equal(results[name][rank][c], wrap_sum(call))


# --- crafted packets ---------------------------------------------------------


def join_controls(lab, hosts, job, world, port):
    """Join a job by hand (control protocol only); returns (clients, infos)."""
    from switchml_xdp.client.control import ControlClient

    def body(rank, host):
        c = ControlClient(lab.switch.ip)
        return c, c.join(job, world, rank, host.ip, port, host.mac, timeout=10)

    pairs = run_ranks(lab, hosts, body)
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _crafted_job(lab):
    """A world-2 job on workers 0 and 1 whose packets the test writes itself."""
    port = 48900
    hosts = lab.workers[:2]
    peers = [Peer(lab, h, port) for h in hosts]
    clients, infos = join_controls(lab, hosts, job_name("crafted"), 2, port)
    for p in peers:
        p.join_group(infos[0].group_ip)
    yield peers, infos[0]
    for c in clients:
        c.leave()
        c.close()
    for p in peers:
        p.close()


@pytest.fixture
def crafted_job(lab8, switch):
    """A crafted job on the XDP switch."""
    yield from _crafted_job(lab8)


@pytest.fixture
def crafted_job_on(on_switch):
    """A crafted job on each data plane's switch."""
    yield from _crafted_job(on_switch[0])


def test_duplicate_is_not_added_twice_and_retransmission_gets_shadow(on_switch, crafted_job_on):
    switch = on_switch[1]
    peers, info = crafted_job_on
    a = np.arange(K, dtype=np.int32)
    b = np.full(K, 1000, dtype=np.int32)
    before = counters(switch)
    peers[0].send(data(info, 0, 5, 5, a))
    peers[0].send(data(info, 0, 5, 5, a, flags=wire.FLAG_RETRANS))
    assert peers[0].recv(0.3) is None, "an incomplete slot must not answer"
    peers[1].send(data(info, 1, 5, 5, b))
    for p in peers:  # the multicast RESULT reaches both ranks
        got = p.recv()
        assert got is not None, f"rank at {p.host.ip} got no RESULT"
        hdr, vals = got
        assert hdr["ver_type"] == wire.ver_type(wire.TYPE_RESULT)
        assert not hdr["flags"] & wire.FLAG_SHADOW
        np.testing.assert_array_equal(vals, a + b)  # not 2a + b
    # A retransmission to the completed slot: the stored result, to its sender only.
    peers[0].send(data(info, 0, 5, 5, a, flags=wire.FLAG_RETRANS))
    hdr, vals = peers[0].recv()
    assert hdr["flags"] & wire.FLAG_SHADOW and hdr["seq"] == 5 and hdr["slot"] == 5
    np.testing.assert_array_equal(vals, a + b)
    assert peers[1].recv(0.3) is None, "a shadow reply must be unicast to its sender"
    d = delta(before, counters(switch))
    assert d == {"rx": 4, "aggregated": 1, "dup_dropped": 1, "completed": 1, "shadow_reply": 1}, d


def test_exponent_max_and_flags_or(on_switch, crafted_job_on):
    peers, info = crafted_job_on
    v = np.ones(K, dtype=np.int32)
    peers[0].send(data(info, 0, 9, 77, v, exp=-3,
                                flags=wire.FLAG_NONFINITE))
    peers[1].send(data(info, 1, 9, 77, v, exp=12))
    hdr, vals = peers[1].recv()
    assert hdr["exp"] == 12 and hdr["flags"] & wire.FLAG_NONFINITE
    np.testing.assert_array_equal(vals, 2 * v)
    assert peers[0].recv()[0]["exp"] == 12  # rank 0's copy of the multicast
    # The other version of the same slot starts afresh: the first one overwrites.
    peers[0].send(data(info, 0, 9, 78, 5 * v, exp=-7,
                                flags=wire.FLAG_SLOT_VER))
    peers[1].send(data(info, 1, 9, 78, v, exp=-9,
                                flags=wire.FLAG_SLOT_VER))
    hdr, vals = peers[0].recv()
    assert hdr["exp"] == -7 and hdr["flags"] & wire.FLAG_SLOT_VER
    assert not hdr["flags"] & wire.FLAG_NONFINITE
    np.testing.assert_array_equal(vals, 6 * v)


def _frame(lab, src_host, payload: bytes, ip_len=None, udp_len=None, ihl=5) -> bytes:
    """A whole Ethernet frame to the switch's data port (for raw sends)."""
    return udp_frame(endpoint(src_host, 48900), endpoint(lab.switch, wire.DEFAULT_PORT), payload,
                     udp_length=udp_len, ip_length=ip_len, ip_options=b"\x01" * (4 * (ihl - 5)))


def test_bad_packets_dropped_by_reason_and_valid_job_stays_exact(lab8, switch, crafted_job):
    peers, info = crafted_job
    J, v = info.job_id, np.ones(K, dtype=np.int32)
    good = data(info, 0, 1, 1, v)
    cases = {  # reason -> UDP payloads sent from rank 0's socket
        "bad_version": [bytes([0x11]) + good[1:], bytes([0x31]) + good[1:]],
        "bad_type": [bytes([wire.ver_type(wire.TYPE_RESULT)]) + good[1:],
                     bytes([wire.ver_type(3)]) + good[1:]],
        "unknown_job": [wire.datagram(wire.TYPE_DATA, 250, 0, 1, 1, v, key=info.key),
                        wire.datagram(wire.TYPE_DATA, 0, 0, 1, 1, v, key=info.key)],
        "bad_key": [wire.datagram(wire.TYPE_DATA, J, 0, 1, 1, v), data(info, 0, 1, 1, v)[:-8 - 4 * K]
                    + (info.key ^ (1 << 63)).to_bytes(8, "big") + v.tobytes()],
        "bad_op": [data(info, 0, 1, 1, v, op=wire.OP_NUM), data(info, 0, 1, 1, v, fmt=wire.FMT_NUM)],
        "bad_rank": [data(info, 2, 1, 1, v),
                     data(info, 63, 1, 1, v)],
        "bad_slot": [data(info, 0, info.slots, 1, v),
                     data(info, 0, 65535, 1, v)],
        "bad_count": [data(info, 0, 1, 1, np.ones(K - 1, np.int32)),
                      wire.pack_header(wire.TYPE_DATA, J, 0, 1, 1, K + 1, key=info.key) + v.tobytes()],
        # cut inside the swml header and inside the payload
        "truncated": [good[:n] for n in (0, 1, 8, wire.HDR_LEN - 1)]
                     + [good[:n] for n in (wire.HDR_LEN, wire.HDR_LEN + 1, 100, len(good) - 1)],
    }
    # The "truncated" payloads with a full header but short payload carry count=K.
    before = counters(switch)
    for payloads in cases.values():
        for p in payloads:
            peers[0].send(p)
    # Registered ranks sent from the wrong address: another host, another port.
    intruder = Peer(lab8, lab8.workers[2], 48900)
    intruder.send(data(info, 0, 1, 1, v))   # even with the key
    intruder.close()
    wrong_port = Peer(lab8, lab8.workers[0], 48901)
    wrong_port.send(data(info, 0, 1, 1, v))
    wrong_port.close()
    # Raw frames: IP options, a fragment, lying IP length, frames cut short.
    frames = [_frame(lab8, lab8.workers[0], good, ihl=6),
              _frame(lab8, lab8.workers[0], good, ip_len=20 + 8 + len(good) + 4),
              *[_frame(lab8, lab8.workers[0], good)[:n]
                for n in (42, 50, wire.HEADERS_LEN - 1, wire.HEADERS_LEN, wire.HEADERS_LEN + 1, 300)]]
    frag = bytearray(_frame(lab8, lab8.workers[0], good))
    frag[20] |= 0x20  # More Fragments
    frames.append(bytes(frag))
    with lab8.enter(lab8.workers[0]):
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        raw.bind((lab8.workers[0].iface, 0))
    for f in frames:
        raw.send(f)
    raw.close()
    time.sleep(0.3)
    d = delta(before, counters(switch))
    expect = {r: len(p) for r, p in cases.items()}
    expect["bad_source"] = 2
    expect["bad_ip"] = 3                      # options, length, fragment
    expect["truncated"] += 6                  # raw frames cut at 42..300 bytes
    for reason, n in expect.items():
        assert d.get(reason, 0) == n, f"{reason}: {d}"
    sent = sum(expect.values())
    assert d["rx"] == sent, d
    assert not d.get("aggregated") and not d.get("completed"), "nothing bad may touch a slot"
    # The crafted job's slot 1 was untouched: a valid round there is exact.
    peers[0].send(data(info, 0, 1, 1, 3 * v))
    peers[1].send(data(info, 1, 1, 1, 4 * v))
    hdr, vals = peers[1].recv()
    np.testing.assert_array_equal(vals, 7 * v)


def test_bad_packets_during_a_streaming_job(lab8, switch):
    """A flood of malformed packets at the switch while a 4-worker job streams."""
    rng = np.random.default_rng(3)
    calls = [random_int32(rng, 30 * K + 5, 4) for _ in range(4)]
    stop = threading.Event()

    def flood():
        with lab8.enter(lab8.workers[5]):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        junk = [wire.datagram(wire.TYPE_DATA, j, r, sl, 0, np.ones(K, np.int32), key=key)
                for j in range(1, 6) for r in (0, 1) for sl in (0, 1, 2) for key in (0, 12345)]
        while not stop.is_set():
            for p in junk:
                s.sendto(p, (lab8.switch.ip, wire.DEFAULT_PORT))
            time.sleep(0.001)
        s.close()

    t = threading.Thread(target=flood)
    before = counters(switch)
    t.start()
    try:
        outs = reduce_on_lab(lab8, switch, 4, calls, job_name("flooded"))
    finally:
        stop.set()
        t.join()
    for c, call in enumerate(calls):
        for rank in range(4):
            np.testing.assert_array_equal(outs[rank][c], wrap_sum(call))
    d = delta(before, counters(switch))
    assert d.get("bad_key", 0) + d.get("unknown_job", 0) > 0


# --- the box stays a box -------------------------------------------------------

def test_ping_and_tcp_reach_the_switch_address(lab8, switch):
    before = counters(switch)
    r = lab8.run(lab8.workers[3], ["ping", "-c", "2", "-W", "2", lab8.switch.ip], check=False,
                 capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    # TCP: the control server on the switch's address answers a status request.
    with lab8.enter(lab8.workers[3]):
        conn = socket.create_connection((lab8.switch.ip, wire.DEFAULT_CONTROL_PORT), timeout=5)
    conn.sendall(b'{"op": "status"}\n')
    reply = json.loads(conn.makefile().readline())
    conn.close()
    assert reply["ok"] and reply["switch"]["ip"] == lab8.switch.ip
    assert counters(switch)["passed"] > before["passed"]


def test_status_from_another_shell_shows_jobs_and_counters(lab8, switch, crafted_job):
    _, info = crafted_job
    r = subprocess.run([sys.executable, "-m", "switchml_xdp.cli.switch", "status", "--json"],
                       capture_output=True, text=True, check=True)
    st = {s["iface"]: s for s in json.loads(r.stdout)["switches"]}[switch.iface]
    assert st["alive"] and st["mode"] == "native"
    assert info.job_id in st["active_job_ids"]
    job = next(j for j in st["jobs"] if j["id"] == info.job_id)
    assert job["state"] == "running" and set(job["members"]) == {"0", "1"}
    assert set(st["counters"]) == set(wire.COUNTER_NAMES)
    human = subprocess.run([sys.executable, "-m", "switchml_xdp.cli.switch", "status"],
                           capture_output=True, text=True, check=True).stdout
    assert switch.iface in human and info.name in human


def test_second_up_on_a_busy_interface_refuses(on_switch):
    lab, switch = on_switch
    r = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "up",
                             switch.iface], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "already up" in r.stderr and str(switch.proc.pid) in r.stderr
    assert switch.proc.poll() is None, "the running switch must be unharmed"
