"""What the afxdp backend makes of RESULTs that the NIC put on another
receive queue than its sockets' (switchml_xdp/client/afxdp_backend.py;
docs/performance.md, "Several queues per worker"): the engine reads them from
the port's UDP socket (stray_results), so the box watch fails a call on them
only where they did not arrive there either; between calls a lane's socket
moves to the queue they came in on where no other lane's socket is; a verbose
worker says what moved, or once that they keep taking the stack. The lab's
run of it: tests/lab/test_afxdp_lanes.py; the redirect program's side:
tests/bpf/test_xdp_redirect_prog.py. No root: engines, program and counters
are fakes."""
from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from switchml_xdp.client import afxdp_backend, engine_backend
from switchml_xdp.client.afxdp_backend import AfxdpBackend


class FakeEngine:
    def __init__(self):
        self.strays, self.queue, self.refuse = 0, None, None

    @property
    def stray_results(self) -> int:
        return self.strays

    def rebind(self, queue: int) -> None:
        if self.refuse:
            raise OSError(self.refuse)
        self.queue = queue


@pytest.fixture
def backend(monkeypatch):
    b = object.__new__(AfxdpBackend)     # no datapath: the counters are faked
    b._engines = [FakeEngine(), FakeEngine()]
    b.iface, b.info, b.verbose = "w0", SimpleNamespace(port=48865, lanes=2), True
    b._strays_told, b._strays_seen, b._queues = False, 0, [0, 1]
    b._call_lock, b._closed, b._prog = threading.Lock(), False, object()
    b.misqueued = 0
    b.came_in_on = {}                    # lane -> the queue of its misqueued RESULTs
    b.moves = []
    monkeypatch.setattr(AfxdpBackend, "_misqueued", lambda self: self.misqueued)
    monkeypatch.setattr(engine_backend.EngineBackend, "allreduce", lambda self, flat, call: None)
    monkeypatch.setattr(afxdp_backend, "take_misqueued_on",
                        lambda prog, lane: b.came_in_on.pop(lane, None))
    monkeypatch.setattr(afxdp_backend, "move_lane",
                        lambda prog, lane, queue: b.moves.append((lane, queue)))
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


def test_a_lane_s_socket_moves_to_a_free_queue_its_results_came_in_on(backend, capsys):
    backend._queues = [0, 1]
    backend.came_in_on = {0: 3}
    backend.misqueued = backend._engines[0].strays = 7
    backend.allreduce(None, None)
    assert backend._engines[0].queue == 3 and backend._engines[1].queue is None
    assert backend.moves == [(0, 3)] and backend._queues == [3, 1]
    err = capsys.readouterr().err
    assert err == ("switchml-xdp: the RESULTs of port 48865 come in on receive queue 3 of w0: "
                   "its AF_XDP socket moved there from queue 0\n")
    backend.allreduce(None, None)          # nothing more came in astray: nothing more said
    assert capsys.readouterr().err == "" and backend.moves == [(0, 3)]


def test_no_socket_moves_onto_another_lane_s_queue(backend, capsys):
    backend.came_in_on = {0: 1, 1: 0}      # each on the other's: the stack it is
    backend.misqueued = backend._engines[0].strays = 7
    backend.allreduce(None, None)
    assert backend.moves == [] and backend._queues == [0, 1]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("switchml-xdp: 7 RESULT(s) came in on the wrong "
                                                   "receive queue of w0"), err
    assert "they reach the engine through the kernel's UDP path, slower than AF_XDP's" in err
    backend.came_in_on = {0: 1, 1: 0}
    backend._engines[0].strays = 9
    backend.allreduce(None, None)          # said once
    assert capsys.readouterr().err == ""


def test_a_socket_that_cannot_move_says_why_and_stays(backend, capsys):
    backend.came_in_on = {1: 2}
    backend._engines[1].refuse = "cannot bind an AF_XDP socket (copy mode) to w0 queue 2: Busy"
    backend.allreduce(None, None)
    assert backend.moves == [] and backend._queues == [0, 1]
    assert capsys.readouterr().err.startswith(
        "switchml-xdp: the RESULTs of port 48866 come in on receive queue 2 of w0, where its "
        "AF_XDP socket cannot move: cannot bind")


def test_a_quiet_worker_moves_the_socket_and_says_nothing(backend, capsys):
    backend.verbose = False
    backend.came_in_on = {0: 2}
    backend.misqueued = backend._engines[0].strays = 7
    backend.allreduce(None, None)
    assert backend.moves == [(0, 2)]
    assert capsys.readouterr().err == ""


def test_a_closed_backend_moves_nothing(backend):
    backend._closed = True
    backend.came_in_on = {0: 2}
    backend.allreduce(None, None)
    assert backend.moves == []
