"""xdp/swml_redirect.c, the worker's program, on crafted frames through
BPF_PROG_TEST_RUN (tests/xdp_tester.py): which frames it hands to the AF_XDP
socket and which to the kernel stack, and in a job with lanes, which lane's
RESULTs it takes on which receive queue. No lab, one compile for the module
(and one for the lanes).

Its XSKMAP is empty here, so a redirect falls back to XDP_PASS: every frame
comes back XDP_PASS and untouched, and the decision is read from the
program's counters.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from frames import IP_MF, IP_OPTIONS_NOP, Endpoint, arp_request, ipv6_udp_frame, tcp_frame, udp_frame
from switchml_xdp import wire
from xdp_tester import Action, RedirectTester, require_bpf

SWITCH = Endpoint("02:5e:00:00:00:01", "10.1.0.1", wire.DEFAULT_PORT)
LOCAL = Endpoint("02:00:00:00:01:02", "10.1.0.2", 41000)      # this worker
GROUP_IP, GROUP_MAC = wire.group_of_job(1)
GROUP = Endpoint(GROUP_MAC, GROUP_IP, LOCAL.port)              # job 1's RESULTs
OTHER = Endpoint("02:00:00:00:01:03", "10.1.0.3", LOCAL.port)  # another worker


def swml(kind: int = wire.TYPE_RESULT, flags: int = 0) -> bytes:
    return wire.datagram(kind, 1, 0, 0, 0, np.ones(8, np.int32), flags=flags)


@pytest.fixture(scope="module")
def redirect_prog():
    require_bpf()
    with RedirectTester(LOCAL, GROUP, SWITCH) as prog:
        yield prog


@pytest.fixture
def rx(redirect_prog):
    redirect_prog.reset()
    return redirect_prog


TO_THE_SOCKET = {
    "multicast result": lambda: udp_frame(SWITCH, GROUP, swml()),
    "unicast result": lambda: udp_frame(SWITCH, LOCAL, swml()),
    "shadow reply": lambda: udp_frame(SWITCH, LOCAL, swml(flags=wire.FLAG_SHADOW | 1)),
}

TO_THE_STACK = {
    "result to another worker": lambda: udp_frame(SWITCH, OTHER, swml()),
    # Only the switch's address and port may send RESULTs (docs/security.md): a forged
    # one goes to the stack, where the socket holding the port drops it unread.
    "result from another host": lambda: udp_frame(OTHER, LOCAL, swml()),
    "multicast result from another host": lambda: udp_frame(OTHER, GROUP, swml()),
    "result from the switch's address, another port": lambda: udp_frame(
        replace(SWITCH, port=SWITCH.port + 1), LOCAL, swml()),
    "result to another port": lambda: udp_frame(SWITCH, replace(LOCAL, port=LOCAL.port + 1),
                                                swml()),
    "data, not a result": lambda: udp_frame(OTHER, LOCAL, swml(kind=wire.TYPE_DATA)),
    "result of another version": lambda: udp_frame(
        SWITCH, LOCAL, bytes([(wire.VERSION + 1) << 4 | wire.TYPE_RESULT]) + swml()[1:]),
    "fragment": lambda: udp_frame(SWITCH, LOCAL, swml(), frag_off=IP_MF),
    "ip options": lambda: udp_frame(SWITCH, LOCAL, swml(), ip_options=IP_OPTIONS_NOP),
    "cut in the swml header": lambda: udp_frame(SWITCH, LOCAL, swml())[:42 + wire.HDR_LEN - 1],
    "cut in the udp header": lambda: udp_frame(SWITCH, LOCAL, swml())[:14 + 20 + 7],
    "tcp to the port": lambda: tcp_frame(SWITCH, LOCAL),
    "arp": lambda: arp_request(SWITCH, LOCAL.ip),
    "ipv6 udp to the port": lambda: ipv6_udp_frame(SWITCH.mac, LOCAL.mac, SWITCH.port, LOCAL.port,
                                                   swml()),
}


def test_before_the_join_nothing_goes_to_the_socket_then_the_switch_results_do():
    """A worker compiles its program before it joins (the join's reply says
    where RESULTs come from): until then it hands the engine nothing, not
    even a RESULT that would match afterwards."""
    require_bpf()
    frame = TO_THE_SOCKET["unicast result"]()
    with RedirectTester(LOCAL, GROUP, None) as rx:
        assert rx.run(frame) == (Action.PASS, frame)
        assert rx.counters() == {"redirected": 0, "passed": 1, "misqueued": 0}
        rx.set_peer(SWITCH)
        rx.reset()
        assert rx.run(frame) == (Action.PASS, frame)
        assert rx.run(TO_THE_STACK["result from another host"]()) == (
            Action.PASS, TO_THE_STACK["result from another host"]())
        assert rx.counters() == {"redirected": 1, "passed": 1, "misqueued": 0}


@pytest.mark.parametrize("name", TO_THE_SOCKET)
def test_results_for_this_worker_go_to_the_socket(rx, name):
    frame = TO_THE_SOCKET[name]()
    assert rx.run(frame) == (Action.PASS, frame)  # the fallback of an empty XSKMAP slot
    assert rx.counters() == {"redirected": 1, "passed": 0, "misqueued": 0}


@pytest.mark.parametrize("name", TO_THE_STACK)
def test_everything_else_goes_to_the_kernel_stack(rx, name):
    frame = TO_THE_STACK[name]()
    assert rx.run(frame) == (Action.PASS, frame)
    assert rx.counters() == {"redirected": 0, "passed": 1, "misqueued": 0}


# -- lanes: lane q's RESULTs at port + q, taken on rx queue q alone -------------------

LANES = 4


@pytest.fixture(scope="module")
def lanes_rx():
    """The program for a worker in LANES lanes, and a LANES-queue interface
    to run it "on" (a veth in a namespace of its own: a test run's queue
    must exist on its interface, in the thread's namespace)."""
    require_bpf()
    from switchml_xdp import net
    from switchml_xdp.lab import netns

    ns = f"swmlt-rxq-{os.getpid()}"
    netns.create_netns(ns)
    try:
        with net.in_netns(ns):
            subprocess.run(["ip", "link", "add", "q0", "numrxqueues", str(LANES), "type", "veth",
                            "peer", "name", "q1"], check=True)
            index = net.link_index("q0")
        with RedirectTester(LOCAL, GROUP, SWITCH, lanes=LANES) as prog:
            yield prog, ns, index
    finally:
        netns.remove_netns(ns)


def lane_result(lane: int, multicast: bool = False) -> bytes:
    to = GROUP if multicast else LOCAL
    return udp_frame(SWITCH, replace(to, port=LOCAL.port + lane), swml())


def run_on_queue(lanes_rx, frame: bytes, queue: int) -> dict[str, int]:
    from switchml_xdp import bpf, net

    prog, ns, index = lanes_rx
    prog.reset()
    with net.in_netns(ns):
        action, out, _ = bpf.prog_test_run(prog.prog.fd, frame, rx=(index, queue))
    assert (action, out) == (Action.PASS, frame)   # redirected or passed, never touched
    return prog.counters()


@pytest.mark.parametrize("multicast", [False, True], ids=["unicast", "multicast"])
@pytest.mark.parametrize("lane", range(LANES))
def test_a_lane_s_results_go_to_the_socket_of_its_own_queue(lanes_rx, lane, multicast):
    assert run_on_queue(lanes_rx, lane_result(lane, multicast), lane) == {
        "redirected": 1, "passed": 0, "misqueued": 0}


@pytest.mark.parametrize("lane, queue", [(1, 0), (0, 1), (3, 2)])
def test_a_lane_s_result_on_another_queue_is_passed_and_counted_misqueued(lanes_rx, lane, queue):
    """An AF_XDP socket takes its own queue's frames alone: a RESULT the NIC
    put elsewhere can reach no engine, and the count says why a call stalls."""
    assert run_on_queue(lanes_rx, lane_result(lane), queue) == {
        "redirected": 0, "passed": 1, "misqueued": 1}


def test_a_misqueued_result_leaves_the_queue_it_came_in_on(lanes_rx):
    """What the backend moves the lane's socket to, between calls
    (afxdp_backend.follow_results); read once."""
    from switchml_xdp.client.afxdp_backend import take_misqueued_on

    prog = lanes_rx[0].prog
    take_misqueued_on(prog, 0)
    run_on_queue(lanes_rx, lane_result(0), 2)
    run_on_queue(lanes_rx, lane_result(0), 3)
    assert take_misqueued_on(prog, 0) == 3
    assert take_misqueued_on(prog, 0) is None


def test_a_moved_lane_s_results_go_to_the_socket_of_its_new_queue(lanes_rx):
    from switchml_xdp.client.afxdp_backend import move_lane, take_misqueued_on

    prog = lanes_rx[0].prog
    move_lane(prog, 1, 3)
    try:
        assert run_on_queue(lanes_rx, lane_result(1), 3) == {
            "redirected": 1, "passed": 0, "misqueued": 0}
        assert run_on_queue(lanes_rx, lane_result(1), 1) == {
            "redirected": 0, "passed": 1, "misqueued": 1}
        assert take_misqueued_on(prog, 1) == 1
        # the other lanes stay where they were
        assert run_on_queue(lanes_rx, lane_result(2), 2)["redirected"] == 1
    finally:
        move_lane(prog, 1, 1)


def test_past_the_last_lane_s_port_is_not_the_job_s(lanes_rx):
    for port in (LOCAL.port - 1, LOCAL.port + LANES):
        frame = udp_frame(SWITCH, replace(LOCAL, port=port), swml())
        assert run_on_queue(lanes_rx, frame, 0) == {"redirected": 0, "passed": 1, "misqueued": 0}
