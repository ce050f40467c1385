"""The udp backend's engine port (worker/udp_port.c) against the fake switch on
the loopback: its sends batched (sendmmsg, and runs of one size as one UDP GSO
message that the kernel cuts into datagrams), every datagram the switch gets
a whole packet, and the sums exact. (The box's DSCP
on the engine's datagrams: tests/unit/test_pace.py, on both loops.)"""
from __future__ import annotations

import time

import numpy as np
import pytest

from fake_switch import echo
from switchml_xdp.client.calls import Call
from switchml_xdp.client.engine_backend import engine_missing
from switchml_xdp.client.plans import streamed

pytestmark = pytest.mark.skipif(bool(engine_missing()), reason=f"no engine: {engine_missing()}")


@pytest.mark.parametrize("fake", ["engine"], indirect=True)    # conftest.py's, one loop
@pytest.mark.parametrize("n", [300 * 64 + 17, 64 * 64])
def test_runs_of_one_size_go_as_gso_messages_and_arrive_as_whole_datagrams(fake, n):
    sw, be = fake(echo, k=64, slots=64)
    x = np.arange(n, dtype=np.int32)
    be.allreduce(streamed(x), Call(0, "fake", n, "int32", "sum", "32"))
    assert np.array_equal(x, np.arange(n, dtype=np.int32))     # world 1: itself
    st = be.stats()
    packets = -(-n // 64)
    assert st["results"] == packets
    # every DATA the switch read was one packet: header whole, count k (a
    # resend sent as the call ended may still be on its way to the switch's
    # thread on a busy machine: waited for, briefly)
    deadline = time.monotonic() + 2.0
    while len(sw.headers) < st["packets_sent"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sw.headers) == st["packets_sent"]
    assert all(int(h["count"]) == 64 for h in sw.headers)
    # the first kick alone sends the initial window as one message (more
    # batches on a quiet machine; one a RESULT where the fake switch is late)
    assert st["udp_gso"] == 1 and st["udp_gso_sends"] > 0, st
    assert st["tx_kicks"] < st["packets_sent"], st
    assert st["udp_rx_truncated"] == 0 and st["ignored"] == 0



@pytest.mark.parametrize("fake", ["engine"], indirect=True)
def test_without_gso_a_datagram_is_a_message(fake, monkeypatch):
    """SWML_UDP_GSO=0 (worker/udp_port.h): the same stream, no GSO message."""
    monkeypatch.setenv("SWML_UDP_GSO", "0")
    sw, be = fake(echo, k=64, slots=64)
    x = np.arange(100 * 64, dtype=np.int32)
    be.allreduce(streamed(x), Call(0, "fake", x.size, "int32", "sum", "32"))
    assert np.array_equal(x, np.arange(100 * 64, dtype=np.int32))
    st = be.stats()
    assert st["udp_gso"] == 0 and st["udp_gso_sends"] == 0
    assert st["tx_kicks"] < st["packets_sent"]     # still batched: sendmmsg


@pytest.mark.parametrize("fake", ["engine"], indirect=True)
@pytest.mark.parametrize("coalesce", [None, "8"])
def test_the_udp_engine_waits_on_its_socket_not_on_a_timer(fake, coalesce, monkeypatch):
    """No timed sleeps by default (udp_engine_backend.py, UDP_COALESCE: they
    cost the udp ranks CPU where they save the afxdp ones some); with
    SWML_UDP_COALESCE=8 the same stream takes them, so the rule is reachable
    here and the default is what turns it off."""
    if coalesce is None:
        monkeypatch.delenv("SWML_UDP_COALESCE", raising=False)
    else:
        monkeypatch.setenv("SWML_UDP_COALESCE", coalesce)
    sw, be = fake(echo, k=64, slots=64)
    n = 400 * 64
    x = np.arange(n, dtype=np.int32)
    be.allreduce(streamed(x), Call(0, "fake", n, "int32", "sum", "32"))
    assert np.array_equal(x, np.arange(n, dtype=np.int32))
    st = be.stats()
    assert (st["coalesced"] > 0) == (coalesce is not None), st
