"""What `swml-lab bench` compares and the link bounds it measures against:
the systems and their labels, the defaults of a run, and each system's
header-adjusted bound on a shaped link. Shared by the orchestrator
(lab_bench.py), the report and the plots; imports nothing of the bench."""
from __future__ import annotations

from .. import wire

SYSTEMS = ("swml-afxdp", "swml-udp", "userspace", "gloo")
LABELS = {
    "swml-afxdp": "switchml-xdp, afxdp",
    "swml-udp": "switchml-xdp, udp",
    "userspace": "user-space switch",
    "gloo": "Gloo ring (TCP)",
}
DEFAULT_WORKERS = (2, 4, 8)
DEFAULT_LOSSES = (0.0, 0.001, 0.01)
DEFAULT_KS = (64, 256)
DEFAULT_RATE_MBIT = 50.0
DEFAULT_SIZE = 8 << 20
DEFAULT_ITERATIONS = 5
DEFAULT_WARMUP = 1
DEFAULT_OUT = "bench/results"
GLOO_PORT = 29500
FOREIGN_WARN_PCT = 5.0       # other processes' CPU share above which a result is flagged

# Header-adjusted link bounds (what the shaper counts: the Ethernet frame from
# destination MAC to the end of the payload; no preamble, FCS or gap, which a
# veth does not have).
SWML_HEADERS = wire.HEADERS_LEN                 # Ethernet 14 + IPv4 20 + UDP 8 + swml 16
TCP_MSS = 1448                                  # MTU 1500 - IPv4 20 - TCP 20 - timestamps 12
TCP_FRAME = TCP_MSS + 14 + 20 + 20 + 12         # 1514


def swml_bound_mbps(rate_mbit: float, k: int) -> float:
    """Most tensor bytes a second a worker can reduce through the switch: each
    packet carries 4k payload bytes in 58 + 4k bytes on the link, and a worker
    sends every byte once and receives every byte once, each way at the rate."""
    return rate_mbit * 4 * k / (SWML_HEADERS + 4 * k)


def gloo_bound_mbps(rate_mbit: float, workers: int) -> float:
    """Ring allreduce moves 2(N-1)/N of the tensor over each link direction, in
    TCP segments of 1448 payload bytes in 1514-byte frames."""
    if workers < 2:
        return float("inf")
    return rate_mbit * TCP_MSS / TCP_FRAME * workers / (2 * (workers - 1))


def bound_mbps(system: str, rate_mbit: float, k: int | None, workers: int) -> float:
    return gloo_bound_mbps(rate_mbit, workers) if system == "gloo" else swml_bound_mbps(rate_mbit, k)
