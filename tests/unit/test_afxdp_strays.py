"""What the afxdp backend makes of RESULTs that the NIC put on another
receive queue than its sockets' (switchml_xdp/client/afxdp_backend.py;
docs/performance.md, "Several queues per worker"): the engine reads them from
the port's UDP socket (stray_results), so the box watch fails a call on them
only where they did not arrive there either, and a verbose worker says once
what steering would bring them to AF_XDP. The lab's run of it:
tests/lab/test_afxdp_lanes.py. No root: the engines and counters are fakes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from switchml_xdp.client import engine_backend
from switchml_xdp.client.afxdp_backend import AfxdpBackend


class FakeEngine:
    def __init__(self):
        self.strays = 0

    def stats(self) -> dict:
        return {"stray_results": self.strays}


@pytest.fixture
def backend(monkeypatch):
    b = object.__new__(AfxdpBackend)     # no datapath: the counters are faked
    b._engines = [FakeEngine(), FakeEngine()]
    b.iface, b.info, b.verbose, b._strays_told = "w0", SimpleNamespace(port=48865, lanes=2), True, False
    b.misqueued = 0
    monkeypatch.setattr(AfxdpBackend, "_misqueued", lambda self: self.misqueued)
    monkeypatch.setattr(engine_backend.EngineBackend, "allreduce", lambda self, flat, call: None)
    return b


def test_misqueued_results_that_reach_the_engine_through_the_stack_are_not_astray(backend):
    check = backend.misroute_check()
    backend.misqueued += 5
    backend._engines[1].strays += 5
    assert check() is None


def test_misqueued_results_that_reach_no_socket_are_astray_saying_so(backend):
    backend._engines[0].strays = 3        # earlier calls' strays do not count
    check = backend.misroute_check()
    assert check() is None
    backend.misqueued += 4
    why = check()
    assert why.startswith("4 RESULT(s) came in on the wrong receive queue of w0")
    assert "`ethtool -N w0 flow-type udp4 dst-port 48865+q action q`" in why
    assert why.endswith("they did not reach the port's UDP socket through the stack either "
                        "(is UDP port 48865 filtered?)")


def test_a_verbose_worker_says_once_that_results_stray(backend, capsys):
    backend.allreduce(None, None)
    assert capsys.readouterr().err == ""          # none strayed yet
    backend.misqueued = backend._engines[0].strays = 7
    backend.allreduce(None, None)
    backend.allreduce(None, None)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("switchml-xdp: 7 RESULT(s) came in on the wrong "
                                                   "receive queue of w0"), err
    assert "they reach the engine through the kernel's UDP path, slower than AF_XDP's" in err


def test_a_quiet_worker_says_nothing(backend, capsys):
    backend.verbose = False
    backend.misqueued = backend._engines[0].strays = 7
    backend.allreduce(None, None)
    assert capsys.readouterr().err == ""
