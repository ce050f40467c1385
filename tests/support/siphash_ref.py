"""SipHash (Aumasson and Bernstein, 2012) written from its paper, in plain
Python: the tests' independent reading of the algorithm that xdp/swml_auth.h
implements, checked against the paper's published vectors."""
from __future__ import annotations

M64 = (1 << 64) - 1


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & M64


def siphash(key: bytes, msg: bytes, c: int = 2, d: int = 4) -> int:
    """SipHash-c-d of msg under a 16-byte key, as the 64-bit integer."""
    k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
    v = [k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
         k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573]

    def rounds(n: int) -> None:
        for _ in range(n):
            v[0] = (v[0] + v[1]) & M64
            v[1] = _rotl(v[1], 13) ^ v[0]
            v[0] = _rotl(v[0], 32)
            v[2] = (v[2] + v[3]) & M64
            v[3] = _rotl(v[3], 16) ^ v[2]
            v[0] = (v[0] + v[3]) & M64
            v[3] = _rotl(v[3], 21) ^ v[0]
            v[2] = (v[2] + v[1]) & M64
            v[1] = _rotl(v[1], 17) ^ v[2]
            v[2] = _rotl(v[2], 32)

    whole = len(msg) - len(msg) % 8
    blocks = [int.from_bytes(msg[i:i + 8], "little") for i in range(0, whole, 8)]
    blocks.append(((len(msg) & 0xFF) << 56) | int.from_bytes(msg[whole:], "little"))
    for m in blocks:
        v[3] ^= m
        rounds(c)
        v[0] ^= m
    v[2] ^= 0xFF
    rounds(d)
    return v[0] ^ v[1] ^ v[2] ^ v[3]
