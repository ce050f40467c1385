"""The one builder of crafted frames in the tests: Ethernet | IPv4 | UDP from
scapy (checksums and lengths computed), the swml header and payload from
switchml_xdp.wire (the generated layout of xdp/swml_wire.h).

    frame = swml_frame(SWITCH, WORKER, data(job=1, rank=0, slot=0, values=v))
    parsed = parse(out_frame)          # scapy packet; parsed[UDP].payload ...
    hdr, vals = swml_of(out_frame)      # numpy record of the header, int32 payload
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

from switchml_xdp import wire


@dataclass(frozen=True)
class Host:
    """An endpoint of a crafted frame."""
    mac: str
    ip: str
    port: int = wire.DEFAULT_PORT


def data(job: int, rank: int, slot: int, values, *, seq: int = 0, flags: int = 0, exp: int = 0,
         kind: int = wire.TYPE_DATA) -> bytes:
    """A swml UDP payload (DATA unless `kind` says otherwise)."""
    return wire.datagram(kind, job, rank, slot, seq, np.asarray(values), flags=flags, exp=exp)


def udp_frame(src, dst, payload: bytes, *, sport: int | None = None, dport: int | None = None,
              udp_len: int | None = None, **ip_fields) -> bytes:
    """Ethernet | IPv4 | UDP src -> dst carrying `payload` (UDP checksum 0).
    src/dst: a Host or a lab host (anything with .mac and .ip; ports default to
    their .port). `ip_fields` set IPv4 header fields as scapy names them
    (options=, frag=, flags="DF", len=, ...); lengths and the IP checksum are
    computed unless given."""
    sport = src.port if sport is None else sport
    dport = dst.port if dport is None else dport
    return bytes(Ether(src=src.mac, dst=dst.mac) / IP(src=src.ip, dst=dst.ip, **ip_fields)
                 / UDP(sport=sport, dport=dport, len=udp_len, chksum=0) / Raw(payload))


def parse(frame: bytes) -> Ether:
    return Ether(frame)


def swml_of(frame: bytes) -> tuple[np.void, np.ndarray]:
    """The swml header (numpy record) and int32 payload of a swml frame."""
    payload = bytes(parse(frame)[UDP].payload)
    return wire.unpack_header(payload), np.frombuffer(payload, "<i4", offset=wire.HDR_LEN)
