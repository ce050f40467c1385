"""docs/security.md, "RESULT authenticators": the algorithm (xdp/swml_auth.h,
reached through the engine) against an independent reading of SipHash and
the paper's vectors; the udp worker refusing and counting RESULTs without
the job's authenticator, from the switch's own address."""
from __future__ import annotations

import secrets

import numpy as np
import pytest

from fake_switch import RESULT_KEY, echo, result_of
from siphash_ref import siphash
from switchml_xdp import _engine, wire
from switchml_xdp.client.calls import Call

PAPER_KEY = bytes(range(16))


def test_the_reference_gives_the_paper_s_vectors():
    assert siphash(PAPER_KEY, b"") == 0x726FDB47DD0E0E31
    assert siphash(PAPER_KEY, bytes(range(15))) == 0xA129CA6149BE45E5


def test_the_wire_names_siphash_2_4_over_the_header_before_the_tag():
    assert (wire.SIP_C_ROUNDS, wire.SIP_D_ROUNDS) == (2, 4)
    assert wire.AUTH_HDR_LEN == wire.AUTH_AT == wire.HDR_DTYPE.fields["key"][1]
    assert wire.AUTH_AT + 8 == wire.HDR_LEN and wire.RESULT_KEY_LEN == 16


@pytest.mark.parametrize("payload_len", [0, 1, 7, 8, 9, 20, 510, 1024, 1440])
@pytest.mark.parametrize("auth", [wire.AUTH_HEADER, wire.AUTH_FULL])
def test_the_c_authenticator_is_siphash_of_what_it_covers(payload_len, auth):
    rng = np.random.default_rng(payload_len * 2 + auth)
    for _ in range(20):
        key = secrets.token_bytes(16)
        buf = rng.integers(0, 256, wire.HDR_LEN + payload_len, dtype=np.uint8).tobytes()
        covered = buf[:wire.AUTH_HDR_LEN] + (buf[wire.HDR_LEN:] if auth == wire.AUTH_FULL else b"")
        assert _engine.result_tag(key, buf, auth, payload_len) == siphash(key, covered)


def test_a_signed_result_is_authentic_and_any_covered_change_is_not():
    buf = bytearray(result_of(wire.unpack_header(wire.pack_header(wire.TYPE_DATA, 3, 0, 1, 9, 4)),
                              np.arange(4, dtype=np.int32), key=None))
    for auth in (wire.AUTH_HEADER, wire.AUTH_FULL):
        wire.sign_result(buf, RESULT_KEY, auth, 16)
        assert wire.result_authentic(buf, len(buf), RESULT_KEY, auth, 16)
        assert not wire.result_authentic(buf, len(buf), bytes(16), auth, 16)   # another key
        assert not wire.result_authentic(buf, len(buf) - 1, RESULT_KEY, wire.AUTH_FULL, 16)
        for at in range(wire.AUTH_HDR_LEN):  # every header byte before the tag is covered
            changed = bytearray(buf)
            changed[at] ^= 0x01
            assert not wire.result_authentic(changed, len(buf), RESULT_KEY, auth, 16), at
        changed = bytearray(buf)
        changed[-1] ^= 0x01   # the payload: covered under full only
        assert wire.result_authentic(changed, len(buf), RESULT_KEY, auth, 16) == \
            (auth == wire.AUTH_HEADER)


def forged_then_real(h, values):
    """From the switch's own address: a RESULT with the values changed,
    unsigned, then signed with another key, then the real one."""
    return [(False, result_of(h, values + 1, key=None)),
            (False, result_of(h, values + 1, key=secrets.token_bytes(16))),
            (False, result_of(h, values))]


def test_forged_results_are_refused_and_counted_and_the_call_is_exact(fake):
    sw, be = fake(forged_then_real)
    x = np.arange(100, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    assert np.array_equal(x, np.arange(100))
    stats = be.stats()
    # two forged answers to every DATA, resends too (the fake switch's thread,
    # late under load, may draw one), and one result a packet
    first = [h for h in sw.headers if not int(h["flags"]) & wire.FLAG_RETRANS]
    assert stats["forged"] == 2 * len(sw.headers) and stats["results"] == len(first)


def tampered_then_real(auth):
    """A RESULT the switch signed (under `auth`) with its values changed after
    the signing, as one who heard it sends it to a member that lost it; then
    the real one."""
    def answer(h, values):
        [(_, real)] = echo(h, values, auth)
        tampered = bytearray(real)
        tampered[-1] ^= 0x40
        return [(False, bytes(tampered)), (False, real)]
    return answer


def test_an_authenticator_over_the_header_alone_lets_changed_values_through():
    """The documented limit of --auth header (docs/security.md): values changed in
    a RESULT that was heard pass where the member lost the real one."""
    from switchml_xdp.client.udp_backend import FMT_BYTES
    real = result_of(wire.unpack_header(wire.pack_header(wire.TYPE_DATA, 3, 0, 1, 9, 8)),
                     np.zeros(8, np.int32))
    tampered = bytearray(real)
    tampered[-4:] = (7).to_bytes(4, "little")
    assert wire.result_authentic(tampered, len(tampered), RESULT_KEY, wire.AUTH_HEADER,
                                 FMT_BYTES[wire.FMT_INT32] * 8)


@pytest.mark.parametrize("precision, dtype", [("32", "int32"), ("32", "float32"),
                                              ("16", "float32")])
def test_with_full_auth_changed_values_are_refused(fake, precision, dtype):
    sw, be = fake(tampered_then_real(wire.AUTH_FULL), auth=wire.AUTH_FULL)
    x = np.arange(50).astype(dtype)
    want = x.copy()
    be.allreduce(x, Call(0, "fake", x.size, dtype, "sum", precision))
    assert np.allclose(x, want, rtol=1e-2)
    assert be.stats()["forged"] == len(sw.headers) > 0


def test_swml_worker_bench_says_when_forged_results_were_refused():
    from switchml_xdp.bench.allreduce_bench import format_table
    row = {"rank": 1, "backend": "udp", "dtype": "int32", "bytes": 4096, "tat_min_s": 1e-3,
           "tat_median_s": 1e-3, "tat_max_s": 1e-3, "goodput_gbps": 1.0, "ate_per_s": 1e6,
           "retransmissions": 0, "verified": 3, "verify_failures": 0}
    assert "forged" not in format_table([{**row, "forged": 0}])
    assert "rank 1 refused 7 forged RESULT(s)" in format_table([{**row, "forged": 7}])
