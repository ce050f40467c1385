"""switchml_xdp/auth_py.py, the RESULT authenticator in Python for hosts
without the engine, against the engine's (xdp/swml_auth.h, the definition)
bit for bit, and against SipHash-2-4's published test vector."""
from __future__ import annotations

import numpy as np
import pytest

from switchml_xdp import auth_py, wire
from switchml_xdp.client.engine_backend import engine_missing


def test_siphash_2_4_reference_vector():
    """Aumasson and Bernstein's vector: key 00..0f, message 00..0e."""
    k0, k1 = int.from_bytes(bytes(range(8)), "little"), int.from_bytes(bytes(range(8, 16)), "little")
    assert (wire.SIP_C_ROUNDS, wire.SIP_D_ROUNDS) == (2, 4)
    assert auth_py.siphash(k0, k1, bytes(range(15))) == 0xA129CA6149BE45E5


@pytest.mark.skipif(bool(engine_missing()), reason=f"the engine: {engine_missing()}")
@pytest.mark.parametrize("auth", [wire.AUTH_HEADER, wire.AUTH_FULL])
def test_the_same_tag_as_the_engine(auth):
    from switchml_xdp import _engine

    rng = np.random.default_rng(7)
    for payload_len in (0, 1, 7, 8, 9, 255, 1024, 1440):
        key = rng.bytes(wire.RESULT_KEY_LEN)
        buf = rng.bytes(wire.HDR_LEN + payload_len + 3)
        assert auth_py.result_tag(key, buf, auth, payload_len) == \
            _engine.result_tag(key, buf, auth, payload_len), (auth, payload_len)


def test_bad_arguments_are_refused_as_the_engine_does():
    with pytest.raises(ValueError, match="16-byte key"):
        auth_py.result_tag(b"short", bytes(64), wire.AUTH_HEADER, 0)
    with pytest.raises(ValueError):
        auth_py.result_tag(bytes(16), bytes(wire.HDR_LEN), wire.AUTH_FULL, 8)


def test_the_python_loop_runs_without_the_engine(fake, monkeypatch):
    """The udp backend's Python loop and the fake switch with wire's tags
    taken from auth_py, as on a host where the engine is not built: a call
    goes through, no RESULT refused."""
    from fake_switch import echo
    from switchml_xdp.client.calls import Call

    monkeypatch.setattr(wire, "_tag_function", lambda: auth_py.result_tag)
    sw, be = fake(echo, k=8, slots=8)
    x = np.arange(8 * 10, dtype=np.int32)
    be.allreduce(x, Call(0, "fake", x.size, "int32", "sum", "32"))
    np.testing.assert_array_equal(x, np.arange(8 * 10, dtype=np.int32))
    assert be.stats()["forged"] == 0
