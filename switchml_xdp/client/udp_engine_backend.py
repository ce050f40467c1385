"""The `udp` backend on the C engine: the stream of worker/stream.c (the afxdp
backend's, engine_backend.py) over the backend's kernel UDP socket
(worker/udp_port.h) instead of an AF_XDP socket, so no root and no XDP.

Where the engine is built this is what backend "udp" runs (udp_backend.py,
`udp_backend()`): datagrams go out in batches (sendmmsg, one syscall a kick)
and come in in batches (recvmmsg), with the engine's timers, window, loss by
evidence and waiting (but for its timed sleeps: UDP_COALESCE); the Python
loop (UdpBackend) stays for hosts without the engine and as the reference its
rules are written in. Both speak the same protocol, so ranks on either share
a job.

The socket is udp_backend.py's: bound to the job's port (port.py), a member of
the job's group, its receive buffer as large. In a job with lanes, one such
socket and engine a lane, lane q's on the job's port + q (docs/performance.md,
"Several queues per worker").
"""
from __future__ import annotations

from .engine_backend import EngineBackend, engine_missing, tunable
from .port import reserve_port

# SWML_UDP_SPIN / SWML_UDP_COALESCE / SWML_UDP_RTO_* override the engine's
# waiting and timeouts for experiments, as SWML_AFXDP_* do for afxdp;
# SWML_UDP_GSO=0 sends a message a datagram (worker/udp_port.h).
ENV_PREFIX = "SWML_UDP_"
RCVBUF = 8 << 20
# Empty polls before a sleep: each is a recvmmsg syscall here (a look at a
# ring in memory on AF_XDP), so the engine sleeps at once when nothing came.
UDP_SPIN = 0
# No timed sleeps for RESULTs to gather (worker/stream.c, "waiting"), where
# afxdp takes them: a wake on the socket already finds about 7 RESULTs at
# 200 Mbit/s, and the timed sleeps cost the udp ranks more wakes a packet
# (0.17-0.20 against 0.14-0.17) and more CPU: 13.9 against 16.7 s/GiB over
# 9 and 6 runs, N=2 behind 32-packet queues (docs/transport.md, "The udp
# backend on the engine").
UDP_COALESCE = 0


class UdpEngineBackend(EngineBackend):
    name = "udp"
    env_prefix = ENV_PREFIX
    streams_lanes = True

    def __init__(self, *args, spin: int | None = None, **kwargs):
        """Backend's arguments (backend.py), and `spin`: the engine's empty
        polls before it sleeps (None: UDP_SPIN, or SWML_UDP_SPIN)."""
        missing = engine_missing()
        if missing:
            raise RuntimeError(f"the udp backend's engine is unavailable: {missing}")
        super().__init__(*args, **kwargs)
        info = self.info
        last = info.port + info.lanes - 1
        self.where = f"udp on {self.local.ip}:{info.port}" + (f"-{last}" if info.lanes > 1 else "")
        self.socks = []
        try:
            for lane in range(info.lanes):
                sock = reserve_port(info.port + lane, info.group_ip, self.local.ip, rcvbuf=RCVBUF)
                self.socks.append(sock)
                sock.setblocking(False)
                self._open("", -1, udp_fd=sock.fileno(), lane=lane,
                           udp_gso=bool(tunable(ENV_PREFIX, "GSO", 1)),
                           spin=spin if spin is not None else tunable(ENV_PREFIX, "SPIN", UDP_SPIN),
                           coalesce=tunable(ENV_PREFIX, "COALESCE", UDP_COALESCE))
        except BaseException:
            self.close()
            raise
        self.abort_signal.on_abort(self._on_abort)  # at once if the job is already aborted

    def _release(self) -> None:
        """The sockets, after the engines that used them closed."""
        for sock in self.socks:
            sock.close()

    @property
    def sock(self):
        """Lane 0's socket."""
        return self.socks[0]
