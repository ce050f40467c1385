"""The RESULT authenticator in Python, for hosts where the worker engine is
not built (no libxdp/libbpf headers: the udp backend's Python loop there).

xdp/swml_auth.h is the definition (SipHash-c-d keyed by the job's result key,
over the header bytes before `key` and, under AUTH_FULL, the payload); the
switch, the user-space data plane and the engine compile that one copy. This
is a transcription for the fallback only: wire.result_tag takes the engine's
where it loads, and tests/unit/test_auth_py.py checks the two agree bit for
bit on random headers, payloads and keys. About 14 us a RESULT under the
default `--auth header`, 0.3 ms under `--auth full` with 1 KiB of payload
(measured here: timeit, one core): a fallback, not a datapath.
"""
from __future__ import annotations

import struct

from . import layout

_MASK = (1 << 64) - 1
_W = layout.DEFINES["swml_wire.h"]   # as wire.py reads them (wire imports this module late)


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _rounds(v: list[int], n: int) -> None:
    v0, v1, v2, v3 = v
    for _ in range(n):
        v0 = (v0 + v1) & _MASK
        v1 = _rotl(v1, 13) ^ v0
        v0 = _rotl(v0, 32)
        v2 = (v2 + v3) & _MASK
        v3 = _rotl(v3, 16) ^ v2
        v0 = (v0 + v3) & _MASK
        v3 = _rotl(v3, 21) ^ v0
        v2 = (v2 + v1) & _MASK
        v1 = _rotl(v1, 17) ^ v2
        v2 = _rotl(v2, 32)
    v[:] = v0, v1, v2, v3


def siphash(k0: int, k1: int, message: bytes) -> int:
    """SipHash-c-d (swml_wire.h's rounds) of `message` under (k0, k1)."""
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
         k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]
    whole = len(message) & ~7
    words = list(struct.unpack_from(f"<{whole // 8}Q", message))
    words.append(((len(message) & 0xFF) << 56) | int.from_bytes(message[whole:], "little"))
    for m in words:
        v[3] ^= m
        _rounds(v, _W["SWML_SIP_C_ROUNDS"])
        v[0] ^= m
    v[2] ^= 0xFF
    _rounds(v, _W["SWML_SIP_D_ROUNDS"])
    return v[0] ^ v[1] ^ v[2] ^ v[3]


def result_tag(result_key: bytes, hdr, auth: int, payload_len: int) -> int:
    """The engine's result_tag (worker/engine_module.c), the same arguments."""
    buf = bytes(hdr)
    full, hdr_len = auth == _W["SWML_AUTH_FULL"], _W["SWML_HDR_LEN"]
    modes = (_W["SWML_AUTH_HEADER"], _W["SWML_AUTH_FULL"])
    if len(result_key) != _W["SWML_RESULT_KEY_LEN"] or auth not in modes \
            or len(buf) < hdr_len + (payload_len if full else 0):
        raise ValueError("result_tag: a 16-byte key, auth 0 or 1, and a header followed by "
                         "payload_len bytes under full auth")
    k0, k1 = struct.unpack("<2Q", result_key)
    message = buf[:_W["SWML_AUTH_HDR_LEN"]]
    if full:
        message += buf[hdr_len:hdr_len + payload_len]
    return siphash(k0, k1, message)
