"""The congestion window and pacing of the worker's backends (docs/transport.md,
"The window").

Both backends follow these rules: the udp backend through this class, the
afxdp engine through worker/window.c, which is the same arithmetic in C on
the same doubles (tests/unit/test_window.py replays one trace through both and
compares every value bit for bit). No clock of its own: the caller passes
the time in seconds, so tests drive it with a fake clock.

Why a window at all: a worker that sends all the job's slots at once puts a
burst of S packets into the first queue of its path; a switch port with a
shallow buffer (32 packets) drops most of it, and retransmissions deepen the
queue (docs/transport.md has the measurements). The window keeps what one
worker has in flight near the path's bandwidth-delay product plus a small
backlog, and pacing spreads it over a round trip.

The rules (Vegas-style backlog estimate, Swift-style proportional decrease,
AIMD on loss):
- the window (packets in flight) starts at `initial` and stays in
  [1, slots]: never more than the job's slots on the switch;
- `backlog` = cwnd * (srtt - base) / srtt estimates how many of this worker's
  packets wait in queues (base: the smallest round trip seen, over the
  worker's life: forgetting it periodically, as Vegas variants do, would let
  the standing backlog ratchet the base up each period). It is in packets,
  not seconds, so one target holds at 50 Mbit/s and at 10 Gbit/s, and a
  32-packet port buffer is never filled by one worker. A path whose base
  round trip grows later only costs throughput: the window shrinks towards
  `target_backlog` packets, never to a stall;
- the target is `target_delay_s` (1 ms) of this worker's sending rate
  (cwnd / srtt), within [`target_backlog`, `max_backlog`] = [8, 32] packets:
  measured in the lab, a fixed 8 kept a 4-worker job on unshaped, CPU-bound
  veth links at half the throughput of no window (the run queue looks like a
  network queue, and a small window means more wake-ups for fewer packets),
  a fixed 16-32 retransmitted 3.5-10% behind a 32-packet queue at 50 Mbit/s;
  1 ms of sending is 8 packets at 50 Mbit/s, ~22 at 200 and 32 above;
- while backlog <= target, each acknowledged packet grows the window by
  ai/cwnd (about `ai` packets a round trip);
- above target, the window shrinks by beta * (backlog - target) / backlog
  (at most max_mdf), at most once a round trip;
- a loss (a retransmission timer expired, or a later packet's result came
  back first) halves it, at most once a round trip, if the last backlog
  estimate was above target: the loss is the queue overflowing. Below
  target a loss found by evidence is not congestion (no queue to overflow:
  a bad optic, a lossy overlay), and the window stays. A timeout below
  target cuts a fifth (`random_loss_md`, TCP Veno's rule): nothing came back
  to show the path works (a stall, a path that drops everything for a
  while). SwitchML makes random loss look about N + 1 times as frequent as
  it is: a round that lost any rank's packet, or its RESULT, is a loss at
  every rank; at 5% loss both ways and 4 ranks, 23% of a rank's rounds. Any
  cut per such round starves the job: a fifth off once a round trip held
  the window near 1 / 0.2 = 5 packets at 5% loss, when timers found every
  loss;
- sends are paced at cwnd per srtt, with a credit of `pace_burst` packets so
  a loop that wakes late (timer slack, a busy core) catches up without a
  burst of the whole window;
- the box's rate (`set_rate`: what its RESULTs stamp in `pace`, docs/transport.md,
  "The box's rate") caps that pace: two sends are at least frame_bits / rate
  apart, window or no window (SWML_WINDOW=off). While the window holds more
  than twice the cap's packets a round trip plus the backlog allowed
  (`target`), it does not grow: it would learn nothing from acks that the
  cap spaced, and once the cap is lifted a window inflated meanwhile would
  go out as one burst. Below that it grows as ever: a window of a packet or
  two (the cap's packets a round trip on a fast path) would let any jitter
  of the round trip hold the stream below the cap.
A slot's round trip also contains the wait for the slowest rank: a rank that
is ahead sees a backlog and slows down to the others' pace, the rank that
completes rounds sees the network's, so the job runs at the pace of its
slowest path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class WindowPolicy:
    enabled: bool = True          # False: all the job's slots at once, no pacing (the old rule)
    initial: float = 16.0         # packets in flight before the first round trip
    ai: float = 1.0               # packets a round trip of additive increase
    beta: float = 0.5             # decrease per unit of relative excess backlog
    max_mdf: float = 0.5          # never shrink by more than this in one step
    target_backlog: float = 8.0   # backlog allowed, in packets, at least ...
    pace_burst: float = 16.0      # packets a late loop may send at once
    random_loss_md: float = 0.2   # the cut on a timeout while the backlog is below target
    max_backlog: float = 32.0     # ... and at most; in between, target_delay_s of sending
    target_delay_s: float = 0.001

    def __post_init__(self) -> None:
        if not (self.initial >= 1 and self.ai > 0 and 0 < self.beta and 0 < self.max_mdf < 1
                and self.target_backlog >= 0 and self.pace_burst >= 1
                and 0 <= self.random_loss_md < 1 and self.max_backlog >= self.target_backlog
                and self.target_delay_s >= 0):
            raise ValueError(f"invalid window policy {self}")

    def as_tuple(self) -> tuple:
        """The C engine's `window` argument: the fields in this order
        (worker/engine_module.c, window_arg)."""
        return tuple(getattr(self, f.name) for f in fields(self))


DEFAULT_WINDOW = WindowPolicy()
NO_WINDOW = WindowPolicy(enabled=False)
ENV_PREFIX = "SWML_WINDOW"


def window_policy(policy: WindowPolicy | None = None) -> WindowPolicy:
    """The policy a backend uses: `policy`, or the default with the
    environment's overrides, knobs for experiments that reach every rank of a
    launcher: SWML_WINDOW=off (the old rule: all slots at once, no pacing),
    SWML_WINDOW_<FIELD>=value (e.g. SWML_WINDOW_TARGET_BACKLOG=16)."""
    if policy is not None:
        return policy
    switch = os.environ.get(ENV_PREFIX, "").strip().lower()
    if switch not in ("", "on", "off"):
        raise ValueError(f"{ENV_PREFIX} must be 'on' or 'off', not {switch!r}")
    changes = {"enabled": switch != "off"}
    for f in fields(WindowPolicy):
        value = os.environ.get(f"{ENV_PREFIX}_{f.name.upper()}")
        if value and f.name != "enabled":
            changes[f.name] = float(value)
    return replace(DEFAULT_WINDOW, **changes)


class CongestionWindow:
    """One worker's window, kept across tensors (what it learnt about the
    path carries over)."""

    def __init__(self, slots: int, policy: WindowPolicy = DEFAULT_WINDOW):
        self.policy, self.slots = policy, slots
        self.cwnd = max(1.0, min(float(slots), policy.initial))
        self.srtt = 0.0                  # 0: no round trip yet
        self.base = 0.0                  # the smallest round trip (0: none yet)
        self.backlog = 0.0               # the last backlog estimate
        self.target = policy.target_backlog   # the backlog allowed, as of the last result
        self.last_decrease = -1e300
        self.next_send = 0.0
        self.rate = 0.0                  # the box's cap in bits/s (0: none)
        self.frame_bits = 0.0            # a DATA frame's bits, headers included

    def set_rate(self, bits_per_s: float, frame_bits: float) -> None:
        """The box's cap on this stream: bits_per_s of frames of frame_bits
        each (0: no cap)."""
        ok = bits_per_s > 0.0 and frame_bits > 0.0
        self.rate = float(bits_per_s) if ok else 0.0
        self.frame_bits = float(frame_bits) if ok else 0.0

    def capped(self) -> bool:
        """The window holds more than twice the cap's packets a round trip
        plus the backlog allowed: no growth."""
        return (self.rate > 0.0
                and self.cwnd > 2.0 * self.rate * self.srtt / self.frame_bits + self.target)

    # ---------------------------------------------------------------- signals
    def _clamp(self) -> None:
        self.cwnd = max(1.0, min(float(self.slots), self.cwnd))

    def _may_decrease(self, now: float) -> bool:
        return self.srtt == 0.0 or now - self.last_decrease >= self.srtt

    def on_ack(self, rtt: float, now: float) -> None:
        """A result for a packet sent once, `rtt` seconds after it went out."""
        p = self.policy
        if self.base == 0.0 or rtt < self.base:
            self.base = rtt
        self.srtt = rtt if self.srtt == 0.0 else 0.875 * self.srtt + 0.125 * rtt
        backlog = self.backlog = self.cwnd * (self.srtt - self.base) / self.srtt
        target = self.target = min(p.max_backlog,
                                   max(p.target_backlog, p.target_delay_s * self.cwnd / self.srtt))
        if backlog <= target:
            if not self.capped():
                self.cwnd += p.ai / self.cwnd
        elif self._may_decrease(now):
            self.cwnd *= 1.0 - min(p.max_mdf, p.beta * (backlog - target) / backlog)
            self.last_decrease = now
        self._clamp()

    def on_loss(self, now: float, timeout: bool = True) -> None:
        """A packet was lost: its timer expired (`timeout`), or a later one's
        result came back first (retransmit.py, "Loss by evidence")."""
        if self.backlog > self.target:
            md = 0.5
        elif timeout:
            md = self.policy.random_loss_md
        else:
            md = 0.0
        if md > 0.0 and self._may_decrease(now):
            self.cwnd *= 1.0 - md
            self.last_decrease = now
            self._clamp()

    # ---------------------------------------------------------------- sending
    def limit(self) -> int:
        """Packets that may be in flight now."""
        return int(self.cwnd) if self.policy.enabled else self.slots

    def window_gap(self) -> float:
        """The window's seconds between two paced sends (0: none yet or at all)."""
        if not self.policy.enabled or self.srtt == 0.0:
            return 0.0
        return self.srtt / self.cwnd

    def rate_gap(self) -> float:
        """The box's cap's seconds between two sends (0: no cap)."""
        return self.frame_bits / self.rate if self.rate > 0.0 else 0.0

    def gap(self) -> float:
        """Seconds between two paced sends (0: no pacing yet or at all)."""
        g, r = self.window_gap(), self.rate_gap()
        return r if r > g else g

    def rate_bound(self) -> bool:
        """The cap, not the window, sets the pace now."""
        return self.rate_gap() > self.window_gap()

    def send_at(self) -> float:
        """The earliest time the next packet may go."""
        return self.next_send

    def sent(self, now: float) -> None:
        """A new packet went out at `now`."""
        g = self.gap()
        if g == 0.0:
            self.next_send = now
            return
        self.next_send = max(self.next_send, now - (self.policy.pace_burst - 1) * g) + g
