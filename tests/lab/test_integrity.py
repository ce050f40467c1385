"""docs/security.md, the data plane and the workers: nothing outside a job
changes or stalls it (the attacks, each against the real XDP switch in
the lab while an honest job reduces int32 tensors checked exactly on every
call, on each worker backend).

- forged RESULTs from another namespace, by an unprivileged user who hears the
  real ones (the lab's bridge floods multicast) and answers each at once;
- a local unprivileged user on a member's host: the worker's port is taken,
  its guesses of the key are dropped;
- root on another host spoofing a member's address without the key;
- every DATA packet a rank sent, replayed while the job goes on.
"""
from __future__ import annotations

import dataclasses
import itertools
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from control_helpers import PORT
from crafted_packets import raw_socket
from frames import ETH_P_IP, endpoint, ethernet, udp_frame
from honest_job import HonestJob
from reliability_helpers import cdelta, switch_counters
from switchml_xdp import wire
from switchml_xdp.lab import netns
from switchml_xdp.lab.cluster import run_ranks

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
FORGER = Path(__file__).resolve().parents[1] / "support" / "forge_results.py"
_names = itertools.count()


def job_name(tag: str) -> str:
    return f"integrity-{tag}-{next(_names)}"


@pytest.fixture
def honest(lab8, switch, worker_backend):
    """The attacked job: workers 0 and 1, reducing and checking tensors of
    256 packets (several windows: a call has packets in flight that an
    attacker who hears its RESULTs can guess, tag included)."""
    job = HonestJob(lab8, job_name(worker_backend), secrets.token_hex(16), lab8.workers[:2],
                    worker_backend, n=256 * wire.DEFAULT_K)
    job.start_rank1()
    try:
        job.wait_running()
        yield job
    finally:
        job.stop.set()


def needs_setpriv():
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode:
        pytest.skip("setpriv (util-linux) is not installed")


def test_the_forger_knows_where_seq_is():
    from forge_results import SEQ_AT, SLOT_AT
    assert SEQ_AT == wire.HDR_DTYPE.fields["seq"][1]
    assert SLOT_AT == wire.HDR_DTYPE.fields["slot"][1]


def test_forged_results_from_an_unprivileged_user_change_nothing(lab8, honest):
    needs_setpriv()
    evil = lab8.workers[2]
    info = honest.workers[0].info
    members = ",".join(h.ip for h in lab8.workers[:2])
    proc = lab8.popen(evil, AS_NOBODY + [sys.executable, str(FORGER), info.group_ip, str(PORT),
                                         evil.ip, "4", str(wire.HDR_LEN), members, str(info.slots),
                                         str(info.slots)],
                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    heard, forged = (int(w) for w in out.split()[1::2])
    assert heard > 10 and forged > 100, out   # the attack really happened, during the job
    honest.finish()


def test_a_local_user_on_a_member_s_host_cannot_take_its_port_or_contribute(lab8, switch, honest):
    needs_setpriv()
    h0 = lab8.workers[0]
    info = honest.workers[0].info
    script = f"""
import errno, socket, sys
for addr in ("0.0.0.0", "{h0.ip}"):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((addr, {PORT}))
        sys.exit(f"bound {{addr}}:{PORT}")
    except OSError as e:
        assert e.errno == errno.EADDRINUSE, e
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for key in range(50):   # guesses of the key, from another port of the member's host
    for slot in range({info.slots}):
        hdr = bytes([0x21, 0, 0, 0]) + ({info.job_id}).to_bytes(2, "big") + bytes(2) \\
            + slot.to_bytes(2, "big") + ({info.k}).to_bytes(2, "big") + bytes(12) \\
            + key.to_bytes(8, "big")
        s.sendto(hdr + bytes(4 * {info.k}), ("{lab8.switch.ip}", {wire.DEFAULT_PORT}))
print("refused")
"""
    before = switch_counters(switch)
    r = lab8.run(h0, AS_NOBODY + [sys.executable, "-c", script], check=False,
                 capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "refused", r.stdout + r.stderr
    time.sleep(0.3)
    d = cdelta(before, switch_counters(switch))
    assert d["bad_key"] + d["bad_source"] >= 50 * info.slots, d
    honest.finish()


def test_root_elsewhere_spoofing_a_member_without_the_key_is_dropped(lab8, switch, honest):
    """Raw frames from another host with rank 0's IP and port as source."""
    h0, evil = lab8.workers[0], lab8.workers[3]
    info = honest.workers[0].info
    raw = raw_socket(lab8, evil)
    src = dataclasses.replace(endpoint(h0, PORT), mac=evil.mac)
    n = 0
    before = switch_counters(switch)
    try:
        for key, slot in itertools.product((0, 1, secrets.randbits(64)), range(info.slots)):
            for seq in (slot, slot + info.slots, 2**31 + slot):
                d = wire.datagram(wire.TYPE_DATA, info.job_id, 0, slot, seq,
                                  np.full(info.k, 7, np.int32), key=key)
                raw.send(udp_frame(src, endpoint(lab8.switch, wire.DEFAULT_PORT), d))
                n += 1
    finally:
        raw.close()
    time.sleep(0.3)
    d = cdelta(before, switch_counters(switch))
    assert d["bad_key"] == n, d
    honest.finish()


def test_replaying_every_packet_a_rank_sent_changes_nothing_and_stalls_nothing(lab8, switch,
                                                                             honest):
    """Every DATA frame rank 0 sent during some calls, captured on its bridge
    port, sent again byte for byte (its real key and address) while the job
    goes on: stale, or the stored result of a round still current, which the
    worker ignores (not a packet of its call)."""
    h0 = lab8.workers[0]
    with netns.in_netns(lab8.bridge_ns):
        # ETH_P_ALL: a bridge port delivers to ETH_P_IP taps only what it does not bridge
        cap = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    cap.bind((h0.peer, 0))
    cap.settimeout(0.2)
    frames, t_end = [], time.monotonic() + 2.0
    data_vt = wire.ver_type(wire.TYPE_DATA)
    try:
        while time.monotonic() < t_end:
            try:
                frame, addr = cap.recvfrom(4096)
            except TimeoutError:
                continue
            if addr[2] != socket.PACKET_OUTGOING and len(frame) > wire.HEADERS_LEN and \
                    frame[36:38] == wire.DEFAULT_PORT.to_bytes(2, "big") and \
                    frame[wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN] == data_vt:
                frames.append(frame)
    finally:
        cap.close()
    assert len(frames) > 50, len(frames)
    before = switch_counters(switch)
    raw = raw_socket(lab8, h0)
    try:
        for _ in range(2):   # in order, twice
            for f in frames:
                raw.send(f)
            time.sleep(0.2)
    finally:
        raw.close()
    honest.finish()
    d = cdelta(before, switch_counters(switch))
    assert d["stale"] > 0, d


def test_frames_not_addressed_to_the_switch_are_not_taken(lab8, switch):
    """A member's real DATA packet (its key, its address) sent VLAN-tagged, to
    another MAC (a bridge floods unknown unicast) or to another IP: passed to
    the kernel, never counted as the switch's; the same packet untagged and to
    the switch is taken."""
    from switchml_xdp.client.control import ControlClient

    h0, h1 = lab8.workers[:2]
    name = job_name("addressed")

    def join(rank, host):
        c = ControlClient(lab8.switch.ip)
        return c, c.join(name, 2, rank, host.ip, PORT, host.mac, timeout=20)

    joined = run_ranks(lab8, [h0, h1], join, timeout=40)
    info = joined[0][1]
    try:
        d = wire.datagram(wire.TYPE_DATA, info.job_id, 0, 0, 0, np.ones(info.k, np.int32),
                          key=info.key)
        to_switch = endpoint(lab8.switch, wire.DEFAULT_PORT)
        frame = udp_frame(endpoint(h0, PORT), to_switch, d)
        tagged = ethernet(lab8.switch.mac, h0.mac, 0x8100,
                          bytes([0, 5]) + ETH_P_IP.to_bytes(2, "big") + frame[14:])
        other_mac = udp_frame(endpoint(h0, PORT),
                              dataclasses.replace(to_switch, mac="02:00:00:00:00:77"), d)
        other_ip = udp_frame(endpoint(h0, PORT), dataclasses.replace(to_switch, ip="10.99.0.1"), d)
        raw = raw_socket(lab8, h0)
        try:
            before = switch_counters(switch)
            for f in (tagged, other_mac, other_ip):
                raw.send(f)
            time.sleep(0.3)
            c = cdelta(before, switch_counters(switch))
            assert c["rx"] == 0 and c["other_host"] == 2 and c["passed"] >= 1, c
            raw.send(frame)
            time.sleep(0.3)
            c = cdelta(before, switch_counters(switch))
            assert c["rx"] == 1 and c["aggregated"] == 1, c
        finally:
            raw.close()
    finally:
        for client, _ in joined:
            client.leave()
            client.close()
