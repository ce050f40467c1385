"""A forger of RESULT packets, run by the integrity tests as an unprivileged
user (`nobody`) on a lab host that is no member of the attacked job.

It does what such a user can on a segment that floods multicast: it binds the
job's UDP port on its own host (SO_REUSEADDR), joins the job's result group,
and on hearing a real RESULT (packet q) it sends forged RESULTs for packets
q+1 .. q+AHEAD: the ones the ranks have in flight right then (same call, same
tag, op and job), each of which the switch answers only when every rank is
in, so a forgery can arrive first. The values are changed. It sends to the
group and to each member's own address, again after every AHEAD/4 packets.
Only the source address is not the switch's: a plain user cannot forge it.

    python forge_results.py GROUP PORT LOCAL_IP SECONDS HDR_LEN MEMBER_IP[,MEMBER_IP...] SLOTS AHEAD

Standard library only (it runs without the package's privileges). Prints
"heard H forged F" when done.
"""
from __future__ import annotations

import socket
import struct
import sys
import time

SEQ_AT = 12   # offsets in the swml header (checked by the test against the layout)
SLOT_AT = 8


def main() -> None:
    group, port, local_ip, seconds, hdr_len, members, slots, ahead = sys.argv[1:9]
    port, seconds, hdr_len = int(port), float(seconds), int(hdr_len)
    slots, ahead = int(slots), int(ahead)
    members = members.split(",")
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    rx.bind(("0.0.0.0", port))
    rx.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                  socket.inet_aton(group) + socket.inet_aton(local_ip))
    rx.settimeout(0.05)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(local_ip))
    heard = forged = 0
    next_spray = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            real = rx.recv(4096)
        except TimeoutError:
            continue
        if len(real) <= hdr_len:
            continue
        heard += 1
        (seq,) = struct.unpack_from("!I", real, SEQ_AT)
        (slot,) = struct.unpack_from("!H", real, SLOT_AT)
        if next_spray is not None and (seq - next_spray) & 0x80000000:
            continue  # this stretch was sprayed already
        next_spray = (seq + max(1, ahead // 4)) & 0xFFFFFFFF
        values = bytes((b + 1) & 0xFF for b in real[hdr_len:])
        for i in range(1, ahead + 1):
            fake = bytearray(real[:hdr_len] + values)
            struct.pack_into("!I", fake, SEQ_AT, (seq + i) & 0xFFFFFFFF)
            struct.pack_into("!H", fake, SLOT_AT, (slot + i) % slots)
            for dest in (group, *members):
                try:
                    tx.sendto(fake, (dest, port))
                    forged += 1
                except OSError:
                    pass
    print(f"heard {heard} forged {forged}", flush=True)


if __name__ == "__main__":
    main()
