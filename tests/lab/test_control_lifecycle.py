"""The control protocol's life cycle (docs/protocol.md) against the real daemon
in the lab: leases, members that go silent or hang up, leave events, and what
needs a daemon of its own (a short idle timeout, a shutdown, clients that never
read, EMFILE during a join)."""
from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from control_helpers import (
    LEASE_S,
    PORT,
    Raw,
    assert_error,
    job_name,
    job_of,
    join_msg,
    status,
    wait_for,
    wait_gone,
)
from switchml_xdp import wire
from switchml_xdp.client.control import ControlClient, ControlError
from switchml_xdp.lab.cluster import SwitchProcess

# --- leases, disconnects and leave ----------------------------------------------

def _client(lab, host) -> ControlClient:
    with lab.enter(host):
        return ControlClient(lab.switch.ip)


def test_silent_member_is_aborted_after_the_lease(lab8, switch):
    name, (h0, h1) = job_name("lease"), lab8.workers[:2]
    free = status(lab8)["slots_free"]
    with Raw(lab8, h1) as silent:
        silent.send(join_msg(name, 2, 1, h1))
        c = _client(lab8, h0)
        try:
            c.join(name, 2, 0, h0.ip, PORT, h0.mac, timeout=10)   # heartbeats from now on
            t0 = time.monotonic()
            assert silent.recv()["ok"]
            reason = wait_for(lambda: c.abort_reason, LEASE_S + 3, "the abort event")
            took = time.monotonic() - t0
            assert LEASE_S - 0.1 <= took <= LEASE_S + 1.0, took
            assert reason == (f"rank 1 ({h1.ip}) stopped heartbeating "
                              f"(lease of {LEASE_S:g} s expired)")
            assert silent.recv() == {"event": "abort", "job": name, "reason": reason}
        finally:
            c.close()
    wait_gone(lab8, name, free)


def test_member_closing_without_leave_aborts_the_job_at_once(lab8, switch):
    name, (h0, h1) = job_name("drop"), lab8.workers[:2]
    free = status(lab8)["slots_free"]
    r = Raw(lab8, h1)
    r.send(join_msg(name, 2, 1, h1))
    c = _client(lab8, h0)
    try:
        c.join(name, 2, 0, h0.ip, PORT, h0.mac, timeout=10)
        assert r.recv()["ok"]
        t0 = time.monotonic()
        r.close()
        reason = wait_for(lambda: c.abort_reason, LEASE_S, "the abort event")
        assert time.monotonic() - t0 < 0.5
        assert reason == f"rank 1 ({h1.ip}) disconnected from the switch without leaving"
        wait_gone(lab8, name, free)
    finally:
        c.close()


def test_leave_events_and_job_end(lab8, switch):
    name, hosts = job_name("leave"), lab8.workers[:3]
    free = status(lab8)["slots_free"]
    rs = [Raw(lab8, h) for h in hosts]
    try:
        for rank, (r, h) in enumerate(zip(rs, hosts)):
            r.send(join_msg(name, 3, rank, h))
        assert all(r.recv()["ok"] for r in rs)
        assert rs[0].request({"op": "heartbeat"}) == {"op": "heartbeat", "ok": True}
        assert rs[2].request({"op": "leave"}) == {"op": "leave", "ok": True, "job_ended": False}
        for r in rs[:2]:
            assert r.recv() == {"event": "left", "job": name, "rank": 2}
        assert rs[2].silent(0.05), "the leaver gets no event about itself"
        j = job_of(status(lab8), name)
        assert j["state"] == "running" and j["members"]["2"]["left"] and not j["members"]["0"]["left"]
        assert_error(rs[2].request({"op": "heartbeat"}), "heartbeat needs a joined job", op="heartbeat")
        assert rs[0].request({"op": "leave"}) == {"op": "leave", "ok": True, "job_ended": False}
        assert rs[1].recv() == {"event": "left", "job": name, "rank": 0}
        assert rs[1].request({"op": "leave"}) == {"op": "leave", "ok": True, "job_ended": True}
        st = status(lab8)
        assert job_of(st, name) is None and st["slots_free"] == free
        # The name is free again.
        assert rs[0].request(join_msg(name, 1, 0, hosts[0]))["ok"]
        assert rs[0].request({"op": "leave"})["job_ended"]
    finally:
        for r in rs:
            r.close()


def test_worker_client_status_and_leave_on_a_joined_connection(lab8, switch):
    """ControlClient.status() after join goes through the reader thread."""
    name, h = job_name("client"), lab8.workers[0]
    free = status(lab8)["slots_free"]
    c = _client(lab8, h)
    try:
        info = c.join(name, 1, 0, h.ip, PORT, h.mac, timeout=10)
        assert info.heartbeat_s == LEASE_S / 4
        time.sleep(info.heartbeat_s * 1.5)  # a heartbeat reply is in flight or arrived
        st = c.status()
        assert st["op"] == "status" and job_of(st, name)["state"] == "running"
        c.leave()
        assert c.abort_reason is None
    finally:
        c.close()
    wait_gone(lab8, name, free)


# --- a daemon of our own -----------------------------------------------------------

@pytest.fixture(scope="module")
def _own_daemon(lab8):  # lab8: skips with the same reason when there can be no lab
    from switchml_xdp.lab import Lab

    with Lab(workers=2) as lab:
        box = {"lab": lab, "sw": None}
        yield box
        sw = box["sw"]
        if sw is not None:
            assert sw.stop() == 0, "\n".join(sw.output[-20:])


@pytest.fixture
def own_switch(_own_daemon):
    """A daemon of our own on a small lab, idle timeout 1 s (SWML_CONTROL_IDLE_S);
    started again if an earlier test stopped it."""
    sw = _own_daemon["sw"]
    if sw is None or sw.proc.poll() is not None:
        sw = _own_daemon["sw"] = SwitchProcess(_own_daemon["lab"], ["--lease", "2"],
                                               env={"SWML_CONTROL_IDLE_S": "1"})
    return sw


def test_idle_client_is_closed_after_the_idle_timeout(own_switch):
    lab = own_switch.lab
    with Raw(lab) as idle, Raw(lab) as busy:
        t0, err = time.monotonic(), None
        while err is None and time.monotonic() - t0 < 3:
            assert busy.request({"op": "status"})["ok"]  # a client that keeps asking stays
            try:
                err = idle.recv(0.3)
            except TimeoutError:
                pass
        assert_error(err, "idle for 1 s without a request; closing")
        assert 0.9 <= time.monotonic() - t0 <= 1.6
        assert idle.recv(3) is None
        time.sleep(0.5)
        assert busy.request({"op": "status"})["ok"]


def test_shutdown_tells_joiners_and_members(own_switch):
    lab, sw = own_switch.lab, own_switch
    w0, w1 = lab.workers
    # A running world-1 job, and a world-2 job waiting at the barrier.
    member = _client(lab, w0)
    joiner = _client(lab, w1)
    try:
        member.join(job_name("solo"), 1, 0, w0.ip, PORT, w0.mac, timeout=10)
        failure, pair = [], job_name("pair")
        t = threading.Thread(target=lambda: _join_expecting_error(joiner, pair, w1, failure))
        t.start()
        wait_for(lambda: job_of(status(lab), pair), what="the joiner to wait")
        assert sw.stop() == 0, "\n".join(sw.output[-20:])
        t.join(10)
        reason = wait_for(lambda: member.abort_reason, 5, "the member's abort")
        assert reason == "the switch is shutting down"
        assert failure == ["join refused: the switch is shutting down"], failure
    finally:
        member.close()
        joiner.close()


def _join_expecting_error(client, name, host, out):
    try:
        client.join(name, 2, 0, host.ip, PORT, host.mac, timeout=20)
        out.append("joined?!")
    except ControlError as e:
        out.append(str(e))


def test_client_that_never_reads_is_dropped(own_switch):
    """It keeps asking (so it is never idle) but reads nothing: once its replies
    have waited for the idle timeout (1 s here), the switch resets it."""
    lab = own_switch.lab
    with Raw(lab) as r:
        # A small receive window from the start (set before connecting), so
        # the switch's send buffer stays small and fills after a few replies.
        r.sock.close()
        with lab.enter(r.host):
            r.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            r.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            r.sock.connect((lab.switch.ip, wire.DEFAULT_CONTROL_PORT))
        r.sock.settimeout(0.2)
        t0, sent, reset = time.monotonic(), 0, None
        while time.monotonic() - t0 < 15 and reset is None:
            try:
                r.sock.sendall(b'{"op": "status"}\n' * 64)
                sent += 64
            except TimeoutError:
                pass   # the switch stopped reading us: it waits for us to read
            except (ConnectionResetError, BrokenPipeError) as e:
                reset = e
        if reset is None:  # what it sent is taken; the reset shows when we read
            try:
                while r.recv(1.0) is not None:
                    pass
            except (ConnectionResetError, TimeoutError) as e:
                reset = e
        assert isinstance(reset, (ConnectionResetError, BrokenPipeError)), \
            f"a client that did not read for {time.monotonic() - t0:.1f} s was not dropped"
    assert status(lab)["ok"], "the daemon serves on"


def test_emfile_during_a_join_leaves_no_phantom_rank(own_switch):
    """The daemon runs out of file descriptors in the middle of a join: the
    joiner gets one line, and no rank, job or slot is left behind."""
    import resource

    from switchml_xdp.switch.state_files import read_state

    lab, (h0, h1) = own_switch.lab, own_switch.lab.workers
    pid = read_state(own_switch.iface)["pid"]
    free = status(lab)["slots_free"]
    name = job_name("emfile")
    limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    with Raw(lab, h1) as r1:   # connected before the limit: the join's own socket is not the victim
        assert r1.request({"op": "status"})["ok"]   # (and accepted by the daemon: it answered)
        used = {int(fd) for fd in os.listdir(f"/proc/{pid}/fd")}
        lowest_free = min(set(range(len(used) + 1)) - used)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, limits[1]))
        try:
            reply = r1.request(join_msg(name, 2, 1, h1, timeout=30))
        except TimeoutError:
            raise AssertionError("no reply; the daemon said:\n" + "\n".join(own_switch.output[-15:]) +
                                 f"\nfds {sorted(used)} limit {lowest_free}") from None
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        assert_error(reply, "the switch could not serve this request: Too many open files", op="join")
        st = status(lab)
        assert job_of(st, name) is None and st["slots_free"] == free, st["jobs"]
        # Rank 1 is free again: the job forms normally.
        with Raw(lab, h0) as r0:
            r0.send(join_msg(name, 2, 0, h0))
            assert r1.request(join_msg(name, 2, 1, h1))["ok"] and r0.recv()["ok"]
