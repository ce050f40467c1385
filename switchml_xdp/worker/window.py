"""The congestion window and pacing policy of the worker's backends (issue 12).

Reference in Python, with no clock of its own (the caller passes the time),
so tests drive it with a fake clock. NOT YET USED by either backend: the
udp backend and the afxdp engine (worker/stream.c) still send the job's
whole window at once; wiring this in is the next step (docs/transport.md).

Rules (Swift-style, delay-based, AIMD on loss):
- the window (packets in flight) starts at `initial` and stays in
  [1, slots]: never more than the job's slots on the switch;
- each acknowledged packet whose round trip is below target (base delay +
  queue allowance) grows the window by ai/cwnd (about `ai` packets a round);
- a round trip above target shrinks it by (1 - beta * excess / rtt), at most
  once a round trip, before the retransmission timer would fire;
- a loss (timer expiry) halves it, at most once a round trip;
- packets are paced at cwnd / srtt: the gap between two sends is srtt / cwnd.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPolicy:
    initial: float = 16.0
    ai: float = 1.0             # packets a round trip of additive increase
    beta: float = 0.8           # multiplicative decrease per unit of relative excess delay
    max_mdf: float = 0.5        # never shrink by more than this in one step
    queue_allowance_s: float = 0.0005   # target = base rtt + this


class CongestionWindow:
    def __init__(self, slots: int, policy: WindowPolicy = WindowPolicy()):
        self.policy, self.slots = policy, slots
        self.cwnd = max(1.0, min(float(slots), policy.initial))
        self.base_rtt: float | None = None
        self.srtt: float | None = None
        self._last_decrease = float("-inf")

    def _clamp(self) -> None:
        self.cwnd = max(1.0, min(float(self.slots), self.cwnd))

    def _may_decrease(self, now: float) -> bool:
        return self.srtt is None or now - self._last_decrease >= self.srtt

    def on_ack(self, rtt: float, now: float) -> None:
        self.base_rtt = rtt if self.base_rtt is None else min(self.base_rtt, rtt)
        self.srtt = rtt if self.srtt is None else 0.875 * self.srtt + 0.125 * rtt
        target = self.base_rtt + self.policy.queue_allowance_s
        if rtt <= target:
            self.cwnd += self.policy.ai / self.cwnd
        elif self._may_decrease(now):
            factor = self.policy.beta * (rtt - target) / rtt
            self.cwnd *= 1 - min(self.policy.max_mdf, factor)
            self._last_decrease = now
        self._clamp()

    def on_loss(self, now: float) -> None:
        if self._may_decrease(now):
            self.cwnd *= 0.5
            self._last_decrease = now
            self._clamp()

    def can_send(self, in_flight: int) -> bool:
        return in_flight < int(self.cwnd)

    def pacing_gap_s(self) -> float:
        """Seconds between two sends: srtt / cwnd (0 until a round trip is known)."""
        return 0.0 if self.srtt is None else self.srtt / self.cwnd
