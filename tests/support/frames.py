"""Whole Ethernet frames for tests that hand frames to XDP programs: built from
parts (so a test can break exactly one of them) and parsed back.

Only Ethernet, IPv4, IPv6, ARP, UDP and TCP headers are written here; the swml
header and payload come from switchml_xdp.wire. UDP checksums are left 0
(allowed over IPv4; the XDP programs neither check nor compute them).
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

from switchml_xdp import wire

ETH_P_IP, ETH_P_ARP, ETH_P_IPV6 = 0x0800, 0x0806, 0x86DD
IPPROTO_TCP, IPPROTO_UDP = 6, 17
IP_DF, IP_MF = 0x4000, 0x2000  # frag_off flags (the rest is the offset in 8-byte units)
BROADCAST = "ff:ff:ff:ff:ff:ff"
IP_OPTIONS_NOP = bytes([1, 1, 1, 0])  # NOP NOP NOP END: one 32-bit word of IPv4 options


@dataclass(frozen=True)
class Endpoint:
    """Where a frame comes from or goes to."""
    mac: str
    ip: str
    port: int = 0


def endpoint(host, port: int) -> Endpoint:
    """An Endpoint for anything with .mac and .ip (a lab Host, say) at `port`."""
    return Endpoint(host.mac, host.ip, port)


mac_bytes = wire.mac_to_bytes   # the package's one definition
mac_text = wire.mac_from_bytes


def ipv4_checksum(header: bytes) -> int:
    """The Internet checksum of an IPv4 header (its checksum field taken as is:
    0 to compute one, the stored one to verify: a valid header sums to 0)."""
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ethernet(dst_mac: str, src_mac: str, ethertype: int, payload: bytes) -> bytes:
    return mac_bytes(dst_mac) + mac_bytes(src_mac) + struct.pack("!H", ethertype) + payload


def ipv4(src: str, dst: str, payload: bytes, *, proto: int = IPPROTO_UDP, options: bytes = b"",
         frag_off: int = IP_DF, total_length: int | None = None, ttl: int = 64) -> bytes:
    """An IPv4 packet with a valid header checksum; options (a multiple of 4
    bytes) and the lengths as given, else as they should be."""
    assert len(options) % 4 == 0, "IPv4 options come in 32-bit words"
    ihl = 5 + len(options) // 4
    length = total_length if total_length is not None else 4 * ihl + len(payload)
    header = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, length, 0, frag_off, ttl, proto, 0,
                         ipaddress.IPv4Address(src).packed,
                         ipaddress.IPv4Address(dst).packed) + options
    checksum = struct.pack("!H", ipv4_checksum(header))
    return header[:10] + checksum + header[12:] + payload


def udp(sport: int, dport: int, payload: bytes, *, length: int | None = None) -> bytes:
    return struct.pack("!HHHH", sport, dport, length if length is not None else 8 + len(payload),
                       0) + payload


def udp_frame(src: Endpoint, dst: Endpoint, payload: bytes, *, ip_options: bytes = b"",
              frag_off: int = IP_DF, ip_length: int | None = None,
              udp_length: int | None = None) -> bytes:
    """Ethernet | IPv4 | UDP from src to dst; the keywords break one field."""
    datagram = udp(src.port, dst.port, payload, length=udp_length)
    return ethernet(dst.mac, src.mac, ETH_P_IP,
                    ipv4(src.ip, dst.ip, datagram, options=ip_options, frag_off=frag_off,
                         total_length=ip_length))


def tcp_frame(src: Endpoint, dst: Endpoint, payload: bytes = b"") -> bytes:
    """A TCP SYN from src to dst (checksum 0: nothing here reads it)."""
    segment = struct.pack("!HHIIBBHHH", src.port, dst.port, 1, 0, 5 << 4, 0x02, 65535, 0, 0)
    return ethernet(dst.mac, src.mac, ETH_P_IP,
                    ipv4(src.ip, dst.ip, segment + payload, proto=IPPROTO_TCP))


def arp_request(src: Endpoint, target_ip: str) -> bytes:
    """Who has target_ip? Tell src (broadcast)."""
    body = struct.pack("!HHBBH6s4s6s4s", 1, ETH_P_IP, 6, 4, 1, mac_bytes(src.mac),
                       ipaddress.IPv4Address(src.ip).packed, bytes(6),
                       ipaddress.IPv4Address(target_ip).packed)
    return ethernet(BROADCAST, src.mac, ETH_P_ARP, body)


def ipv6_udp_frame(src_mac: str, dst_mac: str, sport: int, dport: int, payload: bytes) -> bytes:
    """UDP over IPv6 between link-local addresses."""
    datagram = udp(sport, dport, payload)
    header = struct.pack("!IHBB16s16s", 6 << 28, len(datagram), IPPROTO_UDP, 64,
                         ipaddress.IPv6Address("fe80::1").packed,
                         ipaddress.IPv6Address("fe80::2").packed)
    return ethernet(dst_mac, src_mac, ETH_P_IPV6, header + datagram)


@dataclass(frozen=True)
class UdpFrame:
    """An Ethernet | IPv4 (no options) | UDP frame taken apart."""
    dst: Endpoint
    src: Endpoint
    ttl: int
    ip_checksum_ok: bool
    ip_length: int
    udp_length: int
    udp_checksum: int
    payload: bytes  # the UDP payload, as long as the UDP header says
    tos: int = 0    # the IPv4 TOS byte (DSCP << 2 | ECN)


def parse_udp_frame(frame: bytes) -> UdpFrame:
    ethertype, = struct.unpack_from("!H", frame, 12)
    assert ethertype == ETH_P_IP, f"not IPv4: ethertype {ethertype:#06x}"
    ip = frame[14:34]
    ver_ihl, tos, ip_length, _, _, ttl, proto, _, saddr, daddr = struct.unpack("!BBHHHBBH4s4s", ip)
    assert ver_ihl == 0x45 and proto == IPPROTO_UDP, f"not IPv4/UDP without options: {ip.hex()}"
    sport, dport, udp_length, udp_checksum = struct.unpack_from("!HHHH", frame, 34)
    return UdpFrame(dst=Endpoint(mac_text(frame[0:6]), str(ipaddress.IPv4Address(daddr)), dport),
                    src=Endpoint(mac_text(frame[6:12]), str(ipaddress.IPv4Address(saddr)), sport),
                    ttl=ttl, ip_checksum_ok=ipv4_checksum(ip) == 0, ip_length=ip_length,
                    udp_length=udp_length, udp_checksum=udp_checksum,
                    payload=frame[42:34 + udp_length],  # not the Ethernet padding
                    tos=tos)
