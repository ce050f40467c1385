"""What `swml-lab bench` compares and the link bounds it measures against:
the systems and their labels, the defaults of a run, and each system's
header-adjusted bound on a shaped link. Shared by the orchestrator
(lab_bench.py), the report and the plots; imports nothing of the bench."""
from __future__ import annotations

from collections.abc import Sequence

from .. import wire

# The 16-bit pair compares like with like: the switch's 16-bit block format
# (precision="16") against Gloo reducing the tensor cast to float16, which is
# what torch's fp16_compress_hook does. Both carry 2 bytes an element.
SYSTEMS = ("swml-afxdp", "swml-udp", "userspace", "gloo", "swml-afxdp16", "gloo-fp16")
DEFAULT_SYSTEMS = ("swml-afxdp", "swml-udp", "userspace", "gloo")
LABELS = {
    "swml-afxdp": "switchml-xdp, afxdp",
    "swml-udp": "switchml-xdp, udp",
    "userspace": "user-space switch",
    "gloo": "Gloo ring (TCP)",
    "swml-afxdp16": "switchml-xdp, afxdp, 16-bit",
    "gloo-fp16": "Gloo ring, fp16 compression",
}
GLOO_SYSTEMS = ("gloo", "gloo-fp16")        # no k: a row of theirs matches every k
BYTES_PER_ELEMENT = {"swml-afxdp16": 2, "gloo-fp16": 2}   # on the wire; 4 otherwise
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
SWML_HEADERS = wire.HEADERS_LEN                 # Ethernet 14 + IPv4 20 + UDP 8 + swml 32
SWML_BOUND_DEFINITION = (
    f"rate x 4k / ({SWML_HEADERS} + 4k), or / ({SWML_HEADERS} + 2k) in the 16-bit format: Ethernet "
    f"{wire.ETH_LEN} + IPv4 {wire.IP_LEN} + UDP {wire.UDP_LEN} + swml {wire.HDR_LEN} bytes "
    "of headers a packet")
TCP_MSS = 1448                                  # MTU 1500 - IPv4 20 - TCP 20 - timestamps 12
TCP_FRAME = TCP_MSS + 14 + 20 + 20 + 12         # 1514
GLOO_BOUND_DEFINITION = (
    f"rate x {TCP_MSS}/{TCP_FRAME} x N / (2(N-1)): ring allreduce moves 2(N-1)/N of the tensor "
    f"over each link direction, TCP segments of {TCP_MSS} bytes in {TCP_FRAME}-byte frames")


def swml_bound_mbps(rate_mbit: float, k: int, wire_bytes: int = 4) -> float:
    """Most float32 tensor bytes a second a worker can reduce through the
    switch: each packet carries k elements in wire_bytes * k payload bytes,
    plus 74 bytes of headers, and a worker sends every element once and
    receives it once, each way at the rate."""
    return rate_mbit * 4 * k / (SWML_HEADERS + wire_bytes * k)


def boxes_bound_s(size: int, workers: int, rate_mbit: float, box_rates: Sequence[float | None],
                  k: int, wire_bytes: int = 4) -> float:
    """A job's time through boxes whose ports have `box_rates` (Mbit/s, None:
    unshaped): max(S / worker rate, N S / the boxes' rates summed), each
    packet carrying k elements of wire_bytes behind the headers. A worker
    sends and receives its S; the boxes take in N S between them."""
    wire_bits = size / 4 / k * (SWML_HEADERS + wire_bytes * k) * 8
    worker_s = wire_bits / (rate_mbit * 1e6)
    if any(r is None for r in box_rates):
        return worker_s
    return max(worker_s, workers * wire_bits / (sum(box_rates) * 1e6))


def gloo_bound_mbps(rate_mbit: float, workers: int, wire_bytes: int = 4) -> float:
    """Ring allreduce moves 2(N-1)/N of the tensor over each link direction, in
    TCP segments of 1448 payload bytes in 1514-byte frames; float32 tensor
    bytes a second when each element travels in wire_bytes."""
    if workers < 2:
        return float("inf")
    return rate_mbit * TCP_MSS / TCP_FRAME * workers / (2 * (workers - 1)) * 4 / wire_bytes


def bound_mbps(system: str, rate_mbit: float, k: int | None, workers: int,
               collective: str = "allreduce") -> float:
    """A collective's link bound, in float32 tensor Mbit/s a worker. A ring's
    reduce_scatter is the first half of its allreduce, (N-1)/N of the tensor
    each way; through the switch a worker still sends the whole tensor."""
    wire_bytes = BYTES_PER_ELEMENT.get(system, 4)
    if system in GLOO_SYSTEMS:
        ring = gloo_bound_mbps(rate_mbit, workers, wire_bytes)
        return 2 * ring if collective == "reduce_scatter" else ring
    return swml_bound_mbps(rate_mbit, k, wire_bytes)
