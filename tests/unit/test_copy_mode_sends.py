"""When the afxdp backend's engine sends through its port's UDP socket in
copy mode (switchml_xdp/client/afxdp_backend.py, copy_mode_sends;
docs/performance.md, "The afxdp backend's sends in copy mode"): only where
the kernel's route to the switch leaves as the AF_XDP frames would, and not
when SWML_AFXDP_UDP_TX=0. The socket is made non-blocking either way: the
engine reads the RESULTs that stray onto other queues from it. No root: the
route is stubbed."""
from __future__ import annotations

import socket

import pytest

from switchml_xdp import net
from switchml_xdp.client import afxdp_backend
from switchml_xdp.client.afxdp_backend import copy_mode_sends

LOCAL = ("10.0.0.2", "w0")


@pytest.fixture
def sock():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    yield s
    s.close()


@pytest.fixture
def route(monkeypatch):
    """The route net.route_to reports; a NetError instance: no route."""
    monkeypatch.delenv("SWML_AFXDP_UDP_TX", raising=False)
    answer = {"route": LOCAL}

    def route_to(dst, port=9):
        if isinstance(answer["route"], Exception):
            raise answer["route"]
        return answer["route"]

    monkeypatch.setattr(afxdp_backend.net, "route_to", route_to)
    return answer


def test_the_port_socket_sends_where_the_route_leaves_as_the_frames_would(sock, route):
    assert copy_mode_sends(sock, "10.0.0.1", 48864, *LOCAL)
    assert not sock.getblocking()   # the engine's sendmmsg must never block, nor its recvmmsg


@pytest.mark.parametrize("elsewhere", [("10.0.1.2", "w0"), ("10.0.0.2", "eth9"),
                                       net.NetError("no route to 10.0.0.1")])
def test_a_route_out_of_another_address_or_interface_keeps_the_sends_on_af_xdp(
        sock, route, elsewhere):
    route["route"] = elsewhere
    assert not copy_mode_sends(sock, "10.0.0.1", 48864, *LOCAL)
    assert not sock.getblocking()


def test_swml_afxdp_udp_tx_0_keeps_the_sends_on_af_xdp(sock, route, monkeypatch):
    monkeypatch.setenv("SWML_AFXDP_UDP_TX", "0")
    assert not copy_mode_sends(sock, "10.0.0.1", 48864, *LOCAL)
