"""The workers' side of a box's shares (docs/transport.md, "The box's rate"):
the C engine's pace codes are wire.py's, and the udp backend's DATA say
the call's bytes left, follow the rate and the DSCP of authentic RESULTs
only. Both backends through a real box: tests/lab/test_pace_lab.py."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fake_switch import hold_first_copy_of, result_of
from pace_switch import PacedSwitch, send_rates_bps, stamped
from switchml_xdp import wire
from switchml_xdp.client.calls import Call
from switchml_xdp.client.pace import bytes_left
from switchml_xdp.client.window import DEFAULT_WINDOW


def _engine():
    try:
        from switchml_xdp import _engine
    except ImportError as e:
        pytest.skip(f"the C engine is not built: {e}")
    return _engine


def test_the_engine_s_pace_codes_are_wire_s():
    rng = random.Random(3)
    values = [0, 1, 2047, 2048, 2049, 4095, 4096, 10**6, 2**42 - 1, 2**42, 2**43, 2**64 - 1]
    values += [rng.getrandbits(rng.randint(1, 64)) for _ in range(5000)]
    engine = _engine()
    for v in values:
        assert engine.pace_encode(v) == wire.pace_encode(v), v
    for code in range(1 << 16):
        assert engine.pace_decode(code) == wire.pace_decode(code), code
    assert wire.pace_decode(wire.pace_encode(12345)) == 12345 & ~0x3     # 11 significant bits
    with pytest.raises(ValueError, match="16-bit"):
        engine.pace_decode(1 << 16)


def test_bytes_left_counts_the_packet_itself_and_what_was_never_sent():
    assert bytes_left(10, 3, 3, False, 1024) == 7 * 1024      # a first send: itself and after
    assert bytes_left(10, 10, 9, False, 1024) == 1024         # the last one
    assert bytes_left(10, 10, 2, True, 1024) == 1024          # a resend after all went once
    assert bytes_left(10, 6, 2, True, 512) == 5 * 512


def test_every_data_says_the_call_s_bytes_left(fake):
    sw, be = fake(hold_first_copy_of(5), k=8, slots=4)
    x = np.arange(8 * 40, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    first = {int(h["seq"]): int(h["pace"]) for h in sw.headers
             if not int(h["flags"]) & wire.FLAG_RETRANS}
    assert first == {p: wire.pace_encode((40 - p) * 32) for p in range(40)}
    # packet 5's resend (on evidence, once a later packet's result is in, or
    # on its timer): what never went before it, and itself
    # (another packet may go again first: the tail probe, where the fake
    # switch's thread is late under load)
    at = next(i for i, h in enumerate(sw.headers)
              if int(h["flags"]) & wire.FLAG_RETRANS and int(h["seq"]) == 5)
    went = len({int(h["seq"]) for h in sw.headers[:at]})
    assert 6 <= went <= 9                      # 5 waited for a later packet: 6 at least went
    assert int(sw.headers[at]["seq"]) == 5
    assert int(sw.headers[at]["pace"]) == wire.pace_encode((40 - went + 1) * 32)


K, PACKETS, RATE_KBPS = 64, 500, 2000
FRAME = wire.HEADERS_LEN + 4 * K          # bytes of a DATA frame, headers included
BURST = DEFAULT_WINDOW.pace_burst         # frames a late loop may send at once


def paced_switch(dscp):
    return lambda answer: PacedSwitch(answer, dscp=dscp)


def test_the_udp_backend_sends_at_the_box_s_rate_with_its_dscp(fake):
    """Every RESULT says 2 Mbit/s (~760 frames a second of 330 bytes) and DSCP
    10 (AF11): the DATA never go faster, marked after the first RESULTs. How
    close to the rate they keep is the lab's to measure (a loaded machine
    slows a stream; nothing speeds it up)."""
    sw, be = fake(lambda h, v: [(False, stamped(h, v, RATE_KBPS))], k=K, slots=64,
                  switch=paced_switch(10))
    x = np.ones(K * PACKETS, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    # a loop that woke late may catch up by pace_burst frames, no more
    mean, _ = send_rates_bps(sw.arrivals, FRAME, skip=50)
    assert mean < RATE_KBPS * 1e3 * (PACKETS - 51 + BURST) / (PACKETS - 51)
    stats = be.stats()
    assert stats["rate_kbps"] == RATE_KBPS and stats["dscp"] == 10
    assert stats["rate_waits"] > PACKETS / 2
    assert sw.arrivals[0][2] == 0 and all(tos == 10 << 2 for _, _, tos in sw.arrivals[-100:])


def test_only_authentic_results_set_the_rate_and_the_dscp(fake):
    """From the switch's own port, an unsigned RESULT saying 1 Mbit/s and
    DSCP 46, then the real one, unstamped and unmarked: nothing changes."""
    sw, be = fake(lambda h, v: [(False, stamped(h, v, 1000, key=b""), 46),
                                (False, result_of(h, v), 0)],
                  k=K, slots=64, switch=paced_switch(0))
    x = np.ones(K * 100, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    stats = be.stats()
    # one for each DATA, resends too (the answer to the last may come after the call)
    assert len(sw.headers) - 1 <= stats["forged"] <= len(sw.headers) and stats["forged"] >= 100
    assert stats["rate_kbps"] == 0 and stats["rate_waits"] == 0
    assert stats["dscp"] == 0 and all(tos == 0 for _, _, tos in sw.arrivals)


def test_a_lifted_cap_lets_the_stream_go_at_the_window_s_pace(fake):
    """The first 200 RESULTs say 1 Mbit/s, the later ones nothing (0): the
    last packets go far faster than the cap, and the rate shown is 0."""
    def answer(h, v):
        return [(False, stamped(h, v, 1000 if int(h["seq"]) < 200 else 0))]
    sw, be = fake(answer, k=K, slots=64, switch=paced_switch(0))
    x = np.ones(K * 400, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    capped = [t for t, h, _ in sw.arrivals if 100 <= int(h["seq"]) < 200]
    free = [t for t, h, _ in sw.arrivals if 300 <= int(h["seq"]) < 400]
    assert capped[-1] - capped[0] > (99 - BURST) * FRAME * 8 / 1e6   # never above the cap
    assert free[-1] - free[0] < (capped[-1] - capped[0]) / 2
    assert be.stats()["rate_kbps"] == 0
