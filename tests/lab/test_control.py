"""The control protocol (docs/protocol.md) against the real daemon in the lab.

Most tests talk raw TCP to the shared switch (conftest.py: k=256, 1024 slots,
128 a job, lease 2 s), each with its own job names, so that what is checked is
the wire itself: one JSON object a line, one reply a request, events on a
member's connection. Leases, disconnects and the tests that need a daemon of their own are in
test_control_lifecycle.py; the shared client and waits in control_helpers.py.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from control_helpers import (
    JOB_SLOTS,
    LEASE_S,
    MAX_LINE,
    PORT,
    Raw,
    assert_error,
    job_name,
    job_of,
    join_msg,
    status,
    wait_for,
    wait_gone,
    wait_members,
)
from switchml_xdp import wire

# --- requests the switch refuses ------------------------------------------------

def _bad_join(**change):
    def make(lab, name):
        msg = join_msg(name, 4, 0, lab.workers[0], timeout=5)
        for k, v in change.items():
            if v is _DROP:
                del msg[k]
            else:
                msg[k] = v
        return msg
    return make


_DROP = object()

BAD_REQUESTS = {
    # id: (request: bytes | callable(lab, name) -> dict, op echoed, words in the error)
    "malformed": (b'{"op": "status"', None, ["malformed JSON"]),
    "not-utf8": (b'\xff\xfe{"op"}', None, ["malformed JSON"]),
    "deeply-nested": (b"[" * 50_000, None, ["malformed JSON"]),
    "array": (b'["op", "status"]', None, ["must be a JSON object"]),
    "string": (b'"status"', None, ["must be a JSON object"]),
    "empty-object": (b"{}", None, ["unknown op None"]),
    "unknown-op": (b'{"op": "frobnicate"}', "frobnicate", ["unknown op 'frobnicate'; ops are join,"]),
    "op-wrong-type": (b'{"op": 7}', None, ["unknown op 7"]),
    "op-list": (b'{"op": ["status"]}', None, ["unknown op ['status']"]),
    "heartbeat-unjoined": (b'{"op": "heartbeat"}', "heartbeat", ["heartbeat needs a joined job"]),
    "leave-unjoined": (b'{"op": "leave"}', "leave", ["leave needs a joined job"]),
    "world-str": (_bad_join(world="4"), "join", ["'world' must be an integer, got str"]),
    "world-bool": (_bad_join(world=True), "join", ["'world' must be an integer, got bool"]),
    "world-float": (_bad_join(world=4.0), "join", ["'world' must be an integer, got float"]),
    "world-0": (_bad_join(world=0), "join", ["'world' must be in 1..", "got 0"]),
    "world-65": (_bad_join(world=65), "join", ["'world' must be in 1..64, got 65"]),
    "world-missing": (_bad_join(world=_DROP), "join", ["'world' is required"]),
    "rank-negative": (_bad_join(rank=-1), "join", ["'rank' must be in 0..3, got -1"]),
    "rank-is-world": (_bad_join(rank=4), "join", ["'rank' must be in 0..3, got 4"]),
    "rank-missing": (_bad_join(rank=_DROP), "join", ["'rank' is required"]),
    "port-0": (_bad_join(port=0), "join", ["'port' must be in 1..65535, got 0"]),
    "port-65536": (_bad_join(port=65536), "join", ["'port' must be in 1..65535, got 65536"]),
    "ip-garbage": (_bad_join(ip="not-an-ip"), "join", ["'ip' is not an IPv4 address: 'not-an-ip'"]),
    "ip-int": (_bad_join(ip=167772171), "join", ["'ip' must be a non-empty string"]),
    "ip-v6": (_bad_join(ip="::1"), "join", ["'ip' is not an IPv4 address"]),
    "job-missing": (_bad_join(job=_DROP), "join", ["'job' is required"]),
    "job-empty": (_bad_join(job=""), "join", ["'job' must be a non-empty string"]),
    "job-too-long": (_bad_join(job="j" * 65), "join", ["'job'", "at most 64"]),
    "mac-int": (_bad_join(mac=5), "join", ["'mac' must be a string"]),
    "mac-not-a-mac": (_bad_join(mac="\x1b]0;owned\x07"), "join", ["'mac' must be a MAC address"]),
    "mac-surrogate": (_bad_join(mac="\ud800"), "join", ["'mac' must be a MAC address", "'\\ud800'"]),
    "mac-huge": (_bad_join(mac="m" * 60_000), "join", ["'mac' must be a MAC address"]),
    "k-float": (_bad_join(k=256.0), "join", ["'k' must be an integer, got float"]),
    "unknown-field": (_bad_join(extra=1), "join", ["unknown field 'extra' in join"]),
    "k-mismatch": (_bad_join(k=64), "join", ["k=256", "asked for k=64"]),
    "timeout-0": (_bad_join(timeout=0), "join", ["'timeout' must be a number of seconds"]),
    "timeout-str": (_bad_join(timeout="5"), "join", ["'timeout' must be a number of seconds"]),
    "timeout-huge": (_bad_join(timeout=1e9), "join", ["'timeout' must be a number of seconds"]),
    "timeout-over-ceiling": (_bad_join(timeout=601), "join",
                             ["'timeout' must be a number of seconds in (0, 600]"]),
    "job-escape-codes": (_bad_join(job="j\x1b[2J\x1b[31mred"), "join", ["'job' may contain only letters"]),
    "job-newline": (_bad_join(job="a\nb"), "join", ["'job' may contain only letters"]),
    "job-space": (_bad_join(job="my job"), "join", ["'job' may contain only letters"]),
    "job-slash": (_bad_join(job="../x"), "join", ["'job' may contain only letters"]),
    "job-unicode": (_bad_join(job="j\u202eob"), "join", ["'job' may contain only letters"]),
    "token-int": (_bad_join(token=5), "join", ["'token' must be a non-empty string"]),
    "token-empty": (_bad_join(token=""), "join", ["'token' must be a non-empty string"]),
    "token-too-long": (_bad_join(token="t" * 257), "join", ["'token'", "at most 256"]),
    "token-surrogate": (_bad_join(token="\ud800"), "join", ["'token' must be printable text"]),
    "ip-not-the-connection": (lambda lab, name: join_msg(name, 4, 0, lab.workers[1], timeout=5), "join",
                              ["is not the address this connection comes from"]),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS), ids=list(BAD_REQUESTS))
def test_bad_request_gets_one_line_error_and_connection_keeps_serving(lab8, switch, case):
    request, op, words = BAD_REQUESTS[case]
    name = job_name(case)
    with Raw(lab8) as r:
        # A status first: the error must not echo that earlier request's op.
        assert r.request({"op": "status"})["op"] == "status"
        line = request if isinstance(request, bytes) else json.dumps(request(lab8, name)).encode()
        assert_error(r.request(line), *words, op=op)
        assert r.silent(0.05), "exactly one reply a request"
        again = r.request({"op": "status"})
        assert again["ok"] and again["op"] == "status"
        assert job_of(again, name) is None, "a refused join must leave no job behind"


def test_max_line_accepted_longer_line_refused_and_closed(lab8, switch):
    # A request of exactly MAX_LINE bytes before the newline is served.
    line = b'{"op": "status"}'
    with Raw(lab8) as r:
        assert r.request(line + b" " * (MAX_LINE - len(line)))["ok"]
    # Longer: one error line, then the switch closes -- even if the client is
    # still sending when the switch gives up (no reset eating the reply).
    for size in (MAX_LINE + 1, 200_000, 4_000_000):
        with Raw(lab8) as r:
            sender = threading.Thread(target=lambda: _send_quietly(r.sock, b"x" * size + b"\n"))
            sender.start()
            try:
                assert_error(r.recv(10), f"longer than {MAX_LINE} bytes", "closing")
                assert r.recv(10) is None, "the switch must close the connection"
            finally:
                sender.join(10)
    assert status(lab8)["ok"], "the daemon keeps serving others"


def _send_quietly(sock, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass


def test_hundred_clients_at_once(lab8, switch):
    conns = [Raw(lab8, lab8.workers[i % len(lab8.workers)]) for i in range(100)]
    try:
        for c in conns:
            c.send({"op": "status"})
        for c in conns:
            reply = c.recv(10)
            assert reply["ok"] and reply["op"] == "status" and reply["slots_total"] == 1024
    finally:
        for c in conns:
            c.close()
    assert status(lab8)["ok"]


# --- join: the barrier and its limits -------------------------------------------

def test_join_reply_fields(lab8, switch):
    name, (h0, h1) = job_name("reply"), lab8.workers[:2]
    free = status(lab8)["slots_free"]
    with Raw(lab8, h0) as r0, Raw(lab8, h1) as r1:
        r0.send(join_msg(name, 2, 0, h0, k=256))
        assert r0.silent(0.1), "join returns only when all ranks joined"
        j = wait_members(lab8, name, {0})
        # Slots and an id are taken only when the barrier completes.
        assert j["state"] == "joining" and j["id"] is None and j["slots"] == 0 and j["slot_base"] is None
        assert status(lab8)["slots_free"] == free
        r1.send(join_msg(name, 2, 1, h1))
        replies = [r0.recv(), r1.recv()]
        for rank, rep in enumerate(replies):
            assert rep["ok"] and rep["op"] == "join", rep
            assert (rep["job"], rep["world"], rep["rank"], rep["k"]) == (name, 2, rank, 256)
            assert 1 <= rep["job_id"] <= 255 and rep["slots"] == JOB_SLOTS
            gip, gmac = wire.group_of_job(rep["job_id"])
            assert rep["group"] == {"ip": gip, "mac": gmac, "port": PORT}
            assert gip == f"239.77.{rep['job_id'] >> 8}.{rep['job_id'] & 255}"
            # capacity: the veth's link speed (veth says 10 Gbit/s; docs/scale-out.md)
            assert rep["switch"] == {"iface": switch.iface, "ip": lab8.switch.ip,
                                     "mac": lab8.switch.mac, "port": wire.DEFAULT_PORT,
                                     "fanout": "multicast", "auth": "header",
                                     "capacity_bps": 10 * 10**9, "ports": [switch.iface]}
            # The result key: the same for every rank, never the data key's.
            assert rep["auth"] == "header" and len(bytes.fromhex(rep["result_key"])) == 16
            assert rep["result_key"] == replies[0]["result_key"] != rep["key"]
            assert rep["lease_s"] == LEASE_S and rep["heartbeat_s"] == LEASE_S / 4
        assert replies[0]["job_id"] == replies[1]["job_id"]
        assert replies[0]["slot_base"] == replies[1]["slot_base"]
        j = job_of(status(lab8), name)
        assert j["state"] == "running" and j["id"] == replies[0]["job_id"]
        assert status(lab8)["slots_free"] == free - JOB_SLOTS
        # One join a connection.
        assert_error(r0.request(join_msg(name + "x", 1, 0, h0)), "already joined job", op="join")
        assert r0.request({"op": "leave"}) == {"op": "leave", "ok": True, "job_ended": False}
        assert r1.recv() == {"event": "left", "job": name, "rank": 0}
        assert r1.request({"op": "leave"}) == {"op": "leave", "ok": True, "job_ended": True}
    wait_gone(lab8, name, free)


def test_data_plane_takes_a_job_only_once_all_ranks_joined(lab8, switch):
    import numpy as np

    from switchml_xdp.switch.maps import SwitchMaps

    def counters():
        maps = SwitchMaps(switch.iface)
        try:
            return maps.read_counters()
        finally:
            maps.close()

    name, (h0, h1) = job_name("dataplane"), lab8.workers[:2]
    with lab8.enter(h0):
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((h0.ip, PORT))
    try:
        with Raw(lab8, h0) as r0, Raw(lab8, h1) as r1:
            r0.send(join_msg(name, 2, 0, h0))
            wait_members(lab8, name, {0})
            # The id it will get: the lowest one no other job holds (a joining job holds none).
            used = {j["id"] for j in status(lab8)["jobs"]}
            job_id = min(set(range(1, wire.MAX_JOBS)) - used)
            pkt = wire.datagram(wire.TYPE_DATA, job_id, 0, 0, 0, np.ones(wire.DEFAULT_K, np.int32))
            before = counters()
            udp.sendto(pkt, (lab8.switch.ip, wire.DEFAULT_PORT))
            wait_for(lambda: counters()["unknown_job"] == before["unknown_job"] + 1,
                     what="the joining job's packet to be dropped as unknown_job")
            r1.send(join_msg(name, 2, 1, h1))
            replies = [r0.recv(), r1.recv()]
            assert all(rep["ok"] and rep["job_id"] == job_id for rep in replies), replies
            assert replies[0]["key"] == replies[1]["key"]  # the data key, told to members only
            before = counters()
            udp.sendto(pkt, (lab8.switch.ip, wire.DEFAULT_PORT))  # the same packet: no key
            wait_for(lambda: counters()["bad_key"] == before["bad_key"] + 1,
                     what="the running job's packet without its key to be dropped")
            keyed = wire.datagram(wire.TYPE_DATA, job_id, 0, 0, 0, np.ones(wire.DEFAULT_K, np.int32),
                                  key=int(replies[0]["key"], 16))
            udp.sendto(keyed, (lab8.switch.ip, wire.DEFAULT_PORT))
            wait_for(lambda: counters()["aggregated"] == before["aggregated"] + 1,
                     what="the running job's packet to be aggregated")
            assert counters()["unknown_job"] == before["unknown_job"]
    finally:
        udp.close()


def test_second_world_size_and_second_rank_refused_first_join_undisturbed(lab8, switch):
    name, (h0, h1, h2) = job_name("mismatch"), lab8.workers[:3]
    free = status(lab8)["slots_free"]
    with Raw(lab8, h0) as first, Raw(lab8, h1) as other, Raw(lab8, h2) as dup, Raw(lab8, h0) as same:
        first.send(join_msg(name, 2, 0, h0, timeout=20))
        wait_members(lab8, name, {0})
        assert_error(other.request(join_msg(name, 3, 1, h1)), f"job {name!r} has world 2, this worker says 3",
                     op="join")
        assert_error(dup.request(join_msg(name, 2, 0, h2)),
                     f"rank 0 of job {name!r} already joined from {h0.ip}:{PORT}", op="join")
        assert_error(dup.request(join_msg(name, 2, 1, h2, port=PORT + 1)), f"uses UDP port {PORT}",
                     op="join")
        assert_error(same.request(join_msg(name, 2, 1, h0)), f"rank 0 of job {name!r} already uses",
                     op="join")
        assert first.silent(0.05), "the refusals must not disturb the first joiner"
        # The refused connection serves on: it joins properly now.
        ok = other.request(join_msg(name, 2, 1, h1))
        assert ok["ok"] and ok["rank"] == 1
        rep = first.recv()
        assert rep["ok"] and rep["rank"] == 0 and rep["job_id"] == ok["job_id"]
        # A running job takes no more joins under its name.
        assert_error(dup.request(join_msg(name, 2, 1, h2)), "already running", op="join")
    wait_gone(lab8, name, free)  # both closed without leave: aborted, slots back


def test_barrier_timeout_names_missing_ranks_and_returns_slots(lab8, switch):
    name, hosts = job_name("timeout"), lab8.workers[:3]
    free = status(lab8)["slots_free"]
    with Raw(lab8, hosts[0]) as r:
        t0 = time.monotonic()
        err = assert_error(r.request(join_msg(name, 3, 0, hosts[0], timeout=0.5)), op="join")
        assert 0.45 <= time.monotonic() - t0 < 2.0
        assert err == f"timed out after 0.5 s waiting for rank(s) 1, 2 of job {name!r} (world 3)"
        wait_gone(lab8, name, free)
        # The connection serves on; another rank still waits (holding no slots).
        with Raw(lab8, hosts[2]) as waiting:
            waiting.send(join_msg(name, 3, 2, hosts[2], timeout=20))
            wait_members(lab8, name, {2})
            assert_error(r.request(join_msg(name, 3, 0, hosts[0], timeout=0.3)),
                         "waiting for rank(s) 1 of job", op="join")
            j = wait_members(lab8, name, {2})
            assert j["slots"] == 0 and status(lab8)["slots_free"] == free
    wait_gone(lab8, name, free)  # the last joiner hung up


def test_joiner_hanging_up_during_barrier_frees_its_rank(lab8, switch):
    name, hosts = job_name("hangup"), lab8.workers[:4]
    free = status(lab8)["slots_free"]
    with Raw(lab8, hosts[1]) as r1:
        r1.send(join_msg(name, 3, 1, hosts[1]))
        gone = Raw(lab8, hosts[0])
        gone.send(join_msg(name, 3, 0, hosts[0]))
        wait_members(lab8, name, {0, 1})
        gone.close()
        wait_members(lab8, name, {1})
        # Rank 0 again, from another host: the first one's registration is gone.
        with Raw(lab8, hosts[3]) as r0, Raw(lab8, hosts[2]) as r2:
            r0.send(join_msg(name, 3, 0, hosts[3]))
            r2.send(join_msg(name, 3, 2, hosts[2]))
            reps = [r0.recv(), r1.recv(), r2.recv()]
            assert all(rep["ok"] for rep in reps), reps
            members = job_of(status(lab8), name)["members"]
            assert members["0"]["ip"] == hosts[3].ip
    wait_gone(lab8, name, free)  # all hung up: aborted, slots back


def test_data_sent_during_join_ends_it(lab8, switch):
    name, h = job_name("eager"), lab8.workers[0]
    free = status(lab8)["slots_free"]
    with Raw(lab8, h) as r:
        r.send(join_msg(name, 2, 0, h))
        wait_members(lab8, name, {0})
        r.send({"op": "heartbeat"})
        assert_error(r.recv(), "request sent before the join completed; closing", op="join")
        assert r.recv() is None
    wait_gone(lab8, name, free)


def test_slot_pool_exhaustion_and_release(lab8, switch):
    """Running jobs hold their slots; the pool runs out (the job that cannot
    start is refused, every rank of it told why), then comes back whole when
    their members hang up."""
    st = status(lab8)
    free, total = st["slots_free"], st["slots_total"]
    holders, names = [], []
    try:
        while True:
            name = job_name("pool")
            r = Raw(lab8, lab8.workers[len(holders) % 8])
            holders.append(r)
            reply = r.request(join_msg(name, 1, 0, r.host, timeout=30))
            if not reply["ok"]:
                assert_error(reply, f"job {name!r} could not start: slot pool exhausted",
                             f"of {total} slots free", op="join")
                break
            names.append(name)
            assert len(names) <= total // 8, "the pool never ran out"
        st = status(lab8)
        assert st["slots_free"] < 8
        if free == total == 1024:
            assert len(names) == 8, names
        assert job_of(st, name) is None, "a refused join leaves no job"
        # A world-2 job whose barrier completes on a full pool: both ranks are told.
        name2, (h0, h1) = job_name("pool-full"), lab8.workers[:2]
        with Raw(lab8, h0) as r0, Raw(lab8, h1) as r1:
            r0.send(join_msg(name2, 2, 0, h0))
            wait_members(lab8, name2, {0})
            assert_error(r1.request(join_msg(name2, 2, 1, h1)), "could not start: slot pool exhausted",
                         op="join")
            assert_error(r0.recv(), f"job {name2!r} could not start: slot pool exhausted", op="join")
            assert job_of(status(lab8), name2) is None
    finally:
        for r in holders:
            r.close()
    wait_for(lambda: status(lab8)["slots_free"] == free, what="the slots to come back")
    assert not {j["name"] for j in status(lab8)["jobs"]} & set(names)
