"""The wire format v2, derived from xdp/swml_wire.h (never written down twice):
switchml_xdp.layout, the C compiler's reading of the header.

Exposes the header's constants as module attributes (DEFAULT_PORT, TYPE_DATA,
FLAG_SLOT_VER, CNT_RX, ...), the counter names in row order, a numpy dtype for
the swml header, and helpers to build and parse whole datagrams.
"""
from __future__ import annotations

import functools
import hmac
import ipaddress
import struct

import numpy as np

from . import layout

_D = layout.DEFINES["swml_wire.h"]
globals().update({name[len("SWML_"):]: value for name, value in _D.items()})

#: Counter rows of the switch, in index order: ["rx", "aggregated", ...].
COUNTER_NAMES: list[str] = [
    name[len("SWML_CNT_"):].lower()
    for name, value in sorted(_D.items(), key=lambda kv: kv[1])
    if name.startswith("SWML_CNT_") and name != "SWML_CNT_NUM"
]
#: Counters that are reasons to drop a malformed, foreign or stale packet.
DROP_REASONS = COUNTER_NAMES[COUNTER_NAMES.index("truncated"):]
#: The ops the switch combines with, by the name the API takes.
OPS = {"sum": OP_SUM, "min": OP_MIN, "max": OP_MAX}  # noqa: F821 - set from the layout above

#: numpy dtype of struct swml_hdr (big-endian fields, as on the wire).
HDR_DTYPE = layout.dtype("swml_hdr")
assert HDR_DTYPE.itemsize == HDR_LEN, "swml_hdr size disagrees with SWML_HDR_LEN"  # noqa: F821 - set from the layout above
#: The same header as a `struct` format, for code that packs it field by field.
HDR_STRUCT = struct.Struct(layout.struct_format("swml_hdr"))


#: `swml-switch up --auth`: what a RESULT's authenticator covers, by name.
AUTH_MODES = {"header": AUTH_HEADER, "full": AUTH_FULL}  # noqa: F821 - set from the layout above
#: Where the authenticator sits in a RESULT's swml header (the `key` field).
AUTH_AT = HDR_DTYPE.fields["key"][1]


@functools.cache
def _tag_function():
    """The engine's result_tag (the same C the switch runs, xdp/swml_auth.h),
    or where the engine is not built, its transcription in auth_py.py.
    Chosen once: a failed import searches the path again every time."""
    try:
        from . import _engine  # the C engine: imported when a RESULT is first checked
        return _engine.result_tag
    except ImportError:
        from .auth_py import result_tag
        return result_tag


def result_tag(result_key: bytes, hdr, auth: int, payload_len: int) -> bytes:
    """The authenticator (8 bytes, as a RESULT carries it) for the swml header
    at the start of `hdr`, and under AUTH_FULL the payload_len bytes after it."""
    return _tag_function()(result_key, hdr, auth, payload_len).to_bytes(8, "little")


def sign_result(buf: bytearray, result_key: bytes, auth: int, payload_len: int) -> None:
    """Write a RESULT's authenticator into its header (what the switch does)."""
    buf[AUTH_AT:AUTH_AT + 8] = result_tag(result_key, buf, auth, payload_len)


def result_authentic(buf, nbytes: int, result_key: bytes, auth: int, payload_len: int) -> bool:
    """Whether the RESULT in buf[:nbytes] carries the authenticator of its job's
    result key (payload_len: its payload's bytes, covered under AUTH_FULL)."""
    return result_checker(result_key, auth)(buf, nbytes, payload_len)


def result_checker(result_key: bytes, auth: int):
    """result_authentic for one job, made once: checker(buf, nbytes,
    payload_len) -> bool (the udp backend calls it for every RESULT)."""
    tag_of, full = _tag_function(), auth == AUTH_FULL  # noqa: F821 - set from the layout above

    def authentic(buf, nbytes: int, payload_len: int) -> bool:
        if nbytes < HDR_LEN + (payload_len if full else 0):  # noqa: F821 - set from the layout above
            return False
        want = tag_of(result_key, buf, auth, payload_len).to_bytes(8, "little")
        return hmac.compare_digest(bytes(buf[AUTH_AT:AUTH_AT + 8]), want)
    return authentic


def pace_encode(value: int) -> int:
    """A non-negative integer as a 16-bit pace code (swml_wire.h, SWML_PACE_*):
    exact below 2^MANT_BITS, else rounded down to 11 significant bits;
    saturated at the largest code."""
    value = max(0, int(value))
    e = max(0, value.bit_length() - PACE_MANT_BITS)  # noqa: F821 - set from the layout above
    if e > PACE_EXP_MAX:  # noqa: F821 - set from the layout above
        return 0xFFFF
    return (e << PACE_MANT_BITS) | (value >> e)  # noqa: F821 - set from the layout above


def pace_decode(code: int) -> int:
    """The value a 16-bit pace code stands for."""
    return (code & PACE_MANT_MASK) << (code >> PACE_MANT_BITS)  # noqa: F821 - set from the layout above


def ver_type(kind: int) -> int:
    return (VERSION << 4) | kind  # noqa: F821 - set from the layout above


def group_of_job(job_id: int) -> tuple[str, str]:
    """The multicast group (IPv4, MAC) that RESULTs of a job go to."""
    hi, lo = job_id >> 8, job_id & 0xFF
    ip = f"{MCAST_PREFIX_A}.{MCAST_PREFIX_B}.{hi}.{lo}"  # noqa: F821 - set from the layout above
    mac = f"01:00:5e:{MCAST_PREFIX_B & 0x7F:02x}:{hi:02x}:{lo:02x}"  # noqa: F821 - set from the layout above
    return ip, mac


def pack_header(kind: int, job: int, rank: int, slot: int, seq: int, count: int,
                flags: int = 0, exp: int = 0, *, key: int = 0, tag: int = 0, op: int = 0,
                fmt: int = 0, owner: int = 0, pace: int = 0) -> bytes:
    h = np.zeros(1, HDR_DTYPE)
    h["pace"] = pace
    h["ver_type"], h["flags"], h["job"], h["rank"] = ver_type(kind), flags, job, rank
    h["slot"], h["seq"], h["exp"], h["count"] = slot, seq & 0xFFFFFFFF, exp, count
    h["key"], h["tag"], h["op"], h["fmt"], h["owner"] = key, tag, op, fmt, owner
    return h.tobytes()


def unpack_header(buf: bytes | memoryview) -> np.void:
    """The swml header at the start of `buf` (a UDP payload) as a numpy record."""
    return np.frombuffer(buf, HDR_DTYPE, count=1)[0]


def datagram(kind: int, job: int, rank: int, slot: int, seq: int, values: np.ndarray,
             flags: int = 0, exp: int = 0, **fields) -> bytes:
    """A UDP payload: header (key, tag, op, fmt as keywords) + values as
    little-endian int32."""
    vals = np.ascontiguousarray(values, dtype="<i4")
    return pack_header(kind, job, rank, slot, seq, len(vals), flags, exp, **fields) + vals.tobytes()


def ip_to_be32(ip: str) -> int:
    """An IPv4 address as the integer its network-order bytes read as on this host
    (what a __be32 map field holds)."""
    return int.from_bytes(ipaddress.IPv4Address(ip).packed, "little")


def key_to_be64(key: int) -> int:
    """A data key (the integer the header's big-endian field carries) as a
    __be64 map field holds it on this host."""
    return int.from_bytes(key.to_bytes(8, "big"), "little")


def port_to_be16(port: int) -> int:
    return int.from_bytes(port.to_bytes(2, "big"), "little")


def mac_to_bytes(mac: str) -> bytes:
    """"aa:bb:cc:dd:ee:ff" as the 6 bytes a frame (and a map's __u8[6]) holds."""
    return bytes.fromhex(mac.replace(":", ""))


def mac_from_bytes(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)
