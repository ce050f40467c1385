"""The lab's DSCP priority bands (Lab(dscp_bands=...), lab/shaping.py): two
workers flood the box past its link's rate with kernel UDP sockets, one of
them marked; the box's port serves the higher band first, and without bands
it shares the link between them about equally (needs root)."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from switchml_xdp.lab import Lab
from switchml_xdp.lab.shaping import HTB_CLASS_BASE

RATE_MBIT, BOX_RATE_MBIT = 40, 20    # two workers at twice the box's link each
PORT, PAYLOAD = 48999, b"x" * 1400
WARMUP_S, WINDOW_S = 0.7, 2.0
SNDBUF = 16 * 1024   # the sender blocks on its own shaped queue rather than spin


def class_bytes(lab: Lab) -> dict[str, int]:
    """Bytes sent so far by each HTB class on the box's bridge port."""
    out = subprocess.run(["tc", "-n", lab.bridge_ns, "-s", "class", "show", "dev",
                          lab.switch.peer], capture_output=True, text=True, check=True).stdout
    return {c: int(b) for c, b in re.findall(r"class htb (\S+) .*\n\s*Sent (\d+) bytes", out)}


def tx_bytes(lab: Lab, host) -> int:
    """Bytes `host`'s own interface has sent (past its shaper)."""
    out = lab.run(host, ["ip", "-s", "-j", "link", "show", "dev", host.iface]).stdout
    return json.loads(out)[0]["stats64"]["tx"]["bytes"]


def flood(lab: Lab, host, tos: int, stop: threading.Event) -> threading.Thread:
    """A thread that sends UDP to the box from `host`'s namespace with IP_TOS
    `tos` as fast as its link takes it, until `stop`."""
    with lab.enter(host):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)

    def send():
        with s:
            while not stop.is_set():
                s.sendto(PAYLOAD, (lab.switch.ip, PORT))
    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t


def shares(bands, dscps) -> tuple[list[float], float, list[float]]:
    """Each worker's share of what the box's port sent while both flooded,
    that total as a fraction of the box's link, and each worker's sending rate
    as a fraction of its own link."""
    with Lab(workers=2, rate_mbit=RATE_MBIT, box_rate_mbit=BOX_RATE_MBIT,
             dscp_bands=bands) as lab:
        with lab.enter(lab.switch):   # a bound socket: no port unreachable replies
            sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sink.bind((lab.switch.ip, PORT))
        stop = threading.Event()
        threads = [flood(lab, w, dscp << 2, stop) for w, dscp in zip(lab.workers, dscps)]
        try:
            time.sleep(WARMUP_S)
            before, sent_before = class_bytes(lab), [tx_bytes(lab, w) for w in lab.workers]
            t0 = time.monotonic()
            time.sleep(WINDOW_S)
            after, sent_after = class_bytes(lab), [tx_bytes(lab, w) for w in lab.workers]
            dt = time.monotonic() - t0
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=5)
            sink.close()
    got = [after[c] - before[c] for c in (f"1:{HTB_CLASS_BASE + i:x}" for i in range(2))]
    link = BOX_RATE_MBIT * 1e6 / 8 * dt
    sending = [(a - b) / (RATE_MBIT * 1e6 / 8 * dt) for a, b in zip(sent_after, sent_before)]
    return [g / sum(got) for g in got], sum(got) / link, sending


@pytest.mark.parametrize("dscps, first", [
    ((46, 0), 0),     # the top band against the last one (DSCP 0, listed)
    ((26, 34), 1),    # a middle band against a DSCP no band lists: the last band
])
def test_the_higher_band_gets_the_box_link(dscps, first):
    share, busy, sending = shares((46, 34, 0), dscps)
    assert min(sending) > 0.6, f"both workers flood past the box link: {sending}"
    assert busy > 0.8, f"the box's link is busy: {busy:.2f}"
    assert share[first] >= 0.9, f"the higher band's share of the box link: {share}"


def test_without_bands_the_workers_share_the_link_equally():
    share, busy, sending = shares(None, (46, 0))
    assert min(sending) > 0.6, f"both workers flood past the box link: {sending}"
    assert busy > 0.8, f"the box's link is busy: {busy:.2f}"
    assert 0.4 <= share[0] <= 0.6, f"each worker's share of the box link: {share}"
