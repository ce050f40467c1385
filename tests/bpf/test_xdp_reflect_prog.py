"""xdp/swml_reflect.c, the raw path's reflector, on crafted frames through
BPF_PROG_TEST_RUN: UDP to its port and the box's address comes back with
XDP_TX, addresses and ports swapped and every other byte as it was (the
checksums still right); everything else passes untouched. No lab, one
compile for the module (docs/performance.md, "The path's ceiling")."""
from __future__ import annotations

import pytest

from frames import IP_OPTIONS_NOP, Endpoint, arp_request, parse_udp_frame, tcp_frame, udp_frame
from switchml_xdp import bpf, wire
from xdp_tester import Action, require_bpf

BOX = Endpoint("02:5e:00:00:00:01", "10.2.0.1", wire.DEFAULT_PORT)
WORKER = Endpoint("02:00:00:00:02:02", "10.2.0.2", 41000)
PAYLOAD = bytes(range(256)) * 4 + b"\x01\x02\x03"   # odd length: no word to hide behind


@pytest.fixture(scope="module")
def reflect():
    require_bpf()
    from switchml_xdp.bench.reflector import compile_reflector

    with compile_reflector(BOX.ip, BOX.port) as prog:
        yield lambda frame: (lambda r: (Action(r[0]), r[1]))(bpf.prog_test_run(prog.fd, frame))


def test_a_frame_to_the_port_comes_back_to_its_source_unchanged_but_the_addresses(reflect):
    frame = udp_frame(WORKER, BOX, PAYLOAD)
    action, out = reflect(frame)
    assert action == Action.TX and len(out) == len(frame)
    back = parse_udp_frame(out)
    assert (back.src, back.dst) == (BOX, WORKER)
    assert back.payload == PAYLOAD and back.ip_checksum_ok
    assert back.udp_checksum == parse_udp_frame(frame).udp_checksum   # swapping keeps the sum
    assert out[12:26] == frame[12:26] and out[34 + 4:] == frame[34 + 4:]   # type, ttl, lengths, ...


@pytest.mark.parametrize("name, frame", [
    ("another port", lambda: udp_frame(WORKER, Endpoint(BOX.mac, BOX.ip, BOX.port + 1), PAYLOAD)),
    ("another host", lambda: udp_frame(WORKER, Endpoint(BOX.mac, "10.2.0.9", BOX.port), PAYLOAD)),
    ("IPv4 options", lambda: udp_frame(WORKER, BOX, PAYLOAD, ip_options=IP_OPTIONS_NOP)),
    ("TCP", lambda: tcp_frame(WORKER, BOX)),
    ("ARP", lambda: arp_request(WORKER, BOX.ip)),
    ("a runt", lambda: udp_frame(WORKER, BOX, PAYLOAD)[:40]),
])
def test_everything_else_passes_untouched(reflect, name, frame):
    f = frame()
    action, out = reflect(f)
    assert action == Action.PASS and out == f, name
