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
TCP_HEADERS = 20 + 20 + 12                      # IPv4 20 + TCP 20 + timestamps 12, within the MTU
TCP_MSS = wire.MTU1500 - TCP_HEADERS            # 1448 at MTU 1500 (lab --mtu: MTU - 52)
TCP_FRAME = TCP_MSS + 14 + TCP_HEADERS          # 1514
GLOO_BOUND_DEFINITION = (
    f"rate x {TCP_MSS}/{TCP_FRAME} x N / (2(N-1)): ring allreduce moves 2(N-1)/N of the tensor "
    f"over each link direction, TCP segments of {TCP_MSS} bytes in {TCP_FRAME}-byte frames "
    f"(at another MTU, MTU - {TCP_HEADERS} bytes in MTU + 14)")

BOXES_BOUND_DEFINITION = (
    "through M boxes whose ports run at R_1..R_M: the swml bound at min(rate, (R_1 + ... + R_M) / "
    "N), i.e. max(S / rate, N x S / (R_1 + ... + R_M)) header-adjusted: the boxes take in every "
    "worker's tensor between them (an unshaped box port: the workers' links alone)")
# What a `swml-lab bench` result's figures mean (its JSON's meta, its Markdown's end).
DEFINITIONS = {
    "tat": "tensor aggregation time of one iteration: the slowest rank's allreduce, "
           "timed from a barrier; medians over iterations",
    "goodput": "tensor bits / TAT (per worker)",
    "bound_swml": SWML_BOUND_DEFINITION,
    "bound_boxes": BOXES_BOUND_DEFINITION,
    "bound_gloo": GLOO_BOUND_DEFINITION,
    "cpu": "/proc/stat over the timed allreduces (rank 0's windows), whole machine, "
           "100% = all cores busy",
    "cpu_s_per_gib": "CPU seconds per GiB reduced (GiB: one rank's tensor bytes x calls): ranks: "
                     "user + system time of every rank process over its timed calls (getrusage), "
                     "summed; box: the XDP program's BPF run time plus the switch process's time "
                     "over the whole run; machine: /proc/stat busy time over rank 0's timed calls "
                     "(docs/performance.md, \"CPU per GiB reduced\")",
    "loss": "per worker link and direction: swml UDP via the lab's loss injector, "
            "Gloo TCP via xdp/swml_tcp_loss.c",
}


def swml_bound_mbps(rate_mbit: float, k: int, wire_bytes: int = 4) -> float:
    """Most float32 tensor bytes a second a worker can reduce through the
    switch: each packet carries k elements in wire_bytes * k payload bytes,
    plus 74 bytes of headers, and a worker sends every element once and
    receives it once, each way at the rate."""
    return rate_mbit * 4 * k / (SWML_HEADERS + wire_bytes * k)


def worker_share_mbit(rate_mbit: float, workers: int,
                      box_rates: Sequence[float | None] = ()) -> float:
    """The link rate one worker's stream gets through the boxes: its own link's,
    or its share of the boxes' ports summed where that is less (a box takes
    in every worker's part; None or no boxes: unshaped)."""
    if not box_rates or any(r is None for r in box_rates):
        return rate_mbit
    return min(rate_mbit, sum(box_rates) / workers)


def boxes_bound_s(size: int, workers: int, rate_mbit: float, box_rates: Sequence[float | None],
                  k: int, wire_bytes: int = 4) -> float:
    """A job's time through boxes whose ports have `box_rates` (Mbit/s):
    max(S / worker rate, N S / the boxes' rates summed), header-adjusted."""
    share = worker_share_mbit(rate_mbit, workers, box_rates)
    return size * 8 / (swml_bound_mbps(share, k, wire_bytes) * 1e6)


def gloo_bound_mbps(rate_mbit: float, workers: int, wire_bytes: int = 4,
                    mtu: int = wire.MTU1500) -> float:
    """Ring allreduce moves 2(N-1)/N of the tensor over each link direction, in
    TCP segments of MTU - 52 payload bytes in MTU + 14-byte frames (1448 in
    1514); float32 tensor bytes a second when each element travels in wire_bytes."""
    if workers < 2:
        return float("inf")
    mss = mtu - TCP_HEADERS
    return rate_mbit * mss / (mss + 14 + TCP_HEADERS) * workers / (2 * (workers - 1)) * 4 / wire_bytes


def bound_mbps(system: str, rate_mbit: float, k: int | None, workers: int,
               collective: str = "allreduce", box_rates: Sequence[float | None] = (),
               mtu: int | None = None) -> float:
    """A collective's link bound, in float32 tensor Mbit/s a worker. A ring's
    reduce_scatter is the first half of its allreduce, (N-1)/N of the tensor
    each way; through the switch a worker still sends the whole tensor, over
    boxes whose ports have `box_rates` (boxes_bound_s). `mtu`: the links'
    (None: 1500; the swml packet's size is k's alone, TCP's segments grow with it)."""
    wire_bytes = BYTES_PER_ELEMENT.get(system, 4)
    if system in GLOO_SYSTEMS:
        ring = gloo_bound_mbps(rate_mbit, workers, wire_bytes, mtu or wire.MTU1500)
        return 2 * ring if collective == "reduce_scatter" else ring
    return swml_bound_mbps(worker_share_mbit(rate_mbit, workers, box_rates), k, wire_bytes)
