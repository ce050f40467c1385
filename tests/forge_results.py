"""A forger of RESULT packets, run by the integrity tests as an unprivileged
user (`nobody`) on a lab host that is no member of the attacked job.

It does what such a user can on a segment that floods multicast: it binds the
job's UDP port on its own host (SO_REUSEADDR), joins the job's result group,
and for every real RESULT it hears it sends forged copies at once (same
header: job, slot, seq, tag, op; the values changed), to the group and to
each member's own address, also for the slot's next rounds. Only the source
address is not the switch's: a plain user cannot forge it.

    python forge_results.py GROUP PORT LOCAL_IP SECONDS HDR_LEN MEMBER_IP[,MEMBER_IP...] SLOTS

Standard library only (it runs without the package's privileges). Prints
"heard H forged F" when done.
"""
from __future__ import annotations

import socket
import struct
import sys
import time

SEQ_AT = 12  # offset of seq in the swml header (checked by the test against the layout)


def main() -> None:
    group, port, local_ip, seconds, hdr_len, members, slots = sys.argv[1:8]
    port, seconds, hdr_len, slots = int(port), float(seconds), int(hdr_len), int(slots)
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
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            real = rx.recv(4096)
        except socket.timeout:
            continue
        if len(real) <= hdr_len:
            continue
        heard += 1
        (seq,) = struct.unpack_from("!I", real, SEQ_AT)
        values = bytes((b + 1) & 0xFF for b in real[hdr_len:])
        for ahead in (0, slots, 2 * slots):  # this round, and the slot's next two
            fake = bytearray(real[:hdr_len] + values)
            struct.pack_into("!I", fake, SEQ_AT, (seq + ahead) & 0xFFFFFFFF)
            for dest in (group, *members):
                try:
                    tx.sendto(fake, (dest, port))
                    forged += 1
                except OSError:
                    pass
    print(f"heard {heard} forged {forged}", flush=True)


if __name__ == "__main__":
    main()
