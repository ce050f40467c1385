"""Unit tests of the worker's redirect program (xdp/swml_redirect.c) through
BPF_PROG_TEST_RUN: which frames go to the AF_XDP socket, which to the stack."""
from __future__ import annotations

import numpy as np
import pytest
from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import ARP, Ether

from switchml_xdp import wire

from frames import Host, data, udp_frame
from xdp_tester import RedirectTester, skip_unless_bpf

skip_unless_bpf()

K = 8
JOB, PORT = 3, 41000
GROUP_IP, GROUP_MAC = wire.group_of_job(JOB)
SWITCH = Host("02:00:00:00:00:01", "10.0.0.1", wire.DEFAULT_PORT)
WORKER = Host("02:00:00:00:01:01", "10.0.1.1", PORT)
GROUP = Host(GROUP_MAC, GROUP_IP, PORT)
OTHER = Host("02:00:00:00:01:02", "10.0.1.2", PORT)


@pytest.fixture(scope="module")
def rx():
    t = RedirectTester(WORKER.ip, GROUP_IP, PORT)
    yield t
    t.close()


def result(**hdr) -> bytes:
    return data(JOB, 0, 0, np.arange(K, dtype=np.int32), kind=wire.TYPE_RESULT, **hdr)


@pytest.mark.parametrize("frame", [
    pytest.param(udp_frame(SWITCH, GROUP, result()), id="result-to-group"),
    pytest.param(udp_frame(SWITCH, WORKER, result(flags=wire.FLAG_SHADOW)), id="shadow-reply-to-us"),
])
def test_results_for_us_are_redirected(rx, frame):
    run = rx.run(frame)
    # No socket in the XSKMAP in a test run: the redirect falls back to XDP_PASS.
    assert run.action == "pass" and run.counted == {"redirected"}


@pytest.mark.parametrize("frame", [
    pytest.param(udp_frame(SWITCH, OTHER, result()), id="result-to-another-host"),
    pytest.param(udp_frame(WORKER, GROUP, data(JOB, 0, 0, np.zeros(K, np.int32))), id="data"),
    pytest.param(udp_frame(SWITCH, Host(WORKER.mac, WORKER.ip, PORT + 1), result()), id="other-port"),
    pytest.param(udp_frame(SWITCH, WORKER, result(), flags="MF"), id="fragment"),
    pytest.param(udp_frame(SWITCH, WORKER, result(), options=b"\x01\x01\x01\x00"), id="ip-options"),
    pytest.param(udp_frame(SWITCH, WORKER, result()[:wire.HDR_LEN - 1]), id="short-header"),
    pytest.param(udp_frame(SWITCH, WORKER, bytes([((wire.VERSION + 1) << 4) | wire.TYPE_RESULT])
                           + result()[1:]), id="other-version"),
    pytest.param(bytes(Ether(src=SWITCH.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=SWITCH.ip, pdst=WORKER.ip)),
                 id="arp"),
    pytest.param(bytes(Ether(src=SWITCH.mac, dst=WORKER.mac) / IP(src=SWITCH.ip, dst=WORKER.ip)
                       / TCP(sport=wire.DEFAULT_CONTROL_PORT, dport=PORT)), id="tcp"),
])
def test_everything_else_is_passed(rx, frame):
    run = rx.run(frame)
    assert run.action == "pass" and run.counted == {"passed"}
    assert run.frame == frame
