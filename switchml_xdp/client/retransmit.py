"""The one retransmission policy of the worker's backends.

Every in-flight packet has a timer; each expiry resends the packet and
multiplies its timeout by RTO_BACKOFF (doubles it), up to max_s. The timeout a packet starts with is the
backend's current RTO:
- adaptive: `initial_s` until a round trip has been measured, then srtt +
  4 rttvar (RFC 6298 2.2/2.3) kept within [min_s, max_s]. Round trips are
  sampled from packets sent once only (Karn's rule). A backed-off timeout also
  becomes the RTO for packets sent afterwards until a fresh sample (RFC 6298
  5.5/5.7): behind a deep queue (a shaped link holds the whole window) the
  estimator would otherwise only ever sample the fast packets and resend
  everything else.
- not adaptive: always `initial_s` (min_s is not used).

A late rank: one probe, not a window of resends (RFC 6298 5.4 resends "the
earliest segment"; RFC 5682's F-RTO asks whether a timeout was spurious
before resending more). A packet's result waits for the slowest rank of its
round; when a rank is late (descheduled for a few ms), RESULTs stop and every
packet in flight times out in turn, though none was lost. So a timer that
runs out while RESULTs flow means a loss, and its packet goes again at once.
One that runs out when none has come in since its packet went out, or for an
eighth of the RTO (RTO_QUIET_DIV; far longer than RESULTs are apart while they flow), means
a stall: that packet is resent as the probe, and the others that time out
while it is out are deferred (re-armed, not resent). The probe's RESULT tells
which it was: if this rank's resend completed the round (the RESULT's `rank`
is ours) or the answer is a SHADOW reply (the round was complete, its RESULT
to us lost), the probe made up for a loss, and the deferred packets are resent
at once; else the original was in the round all along, the timeout was
spurious, and the deferred packets get a fresh timeout (the late rank is
back). Its original's round trip is not sampled: it includes the late rank's
wait, maybe its recovery from a loss, and with such samples every rank's RTO
grows to cover the others' (measured: RTOs ran up to the 0.5 s cap at 1%
loss and 8 workers). A packet is deferred once, never twice:
two ranks that each lost a packet could otherwise wait on each other, each
holding back the packet that the other's probe needs, and chains of such
waits across many ranks stall the job (measured: 60x slower at 1% loss and
8 workers when deferrals could repeat).

Loss by evidence (RACK, RFC 8985), before any timer: RESULTs come back in
the order their rounds complete, and a round completes with its slowest
rank's packet, which no packet of a later round overtakes on that rank's
path. So when a packet's RESULT comes back, every packet in flight that went
out more than a quarter of the smoothed round trip before it
(RACK_REORDER_DIV) lost something:
its DATA, another rank's DATA of its round, or its RESULT. It goes again at
once, its timeout as it was (nothing timed out), and its resend is judged
the same way: a lost resend is found by the next RESULTs, not by a doubled
timeout. The n-th resend of a packet on evidence waits until 2^n round
trips (the evidence's, or the smoothed one where longer: it holds the other
ranks' usual lateness) have passed since the last (RACK's time rule, backed
off; n at most RACK_MAX_BACKOFF): the round may
wait for another rank that lost its packet and has yet to resend it
(descheduled, or yet to hear of the loss), and each of our resends meanwhile
is a duplicate (measured: 52% of packets resent at 5% loss, 4 ranks, 1
Gbit/s, without it). The time that counts is a packet's latest
transmission; a RESULT that comes back sooner than the base round trip
after a resend answers the original, and says nothing. Every rank of a
round that lost one rank's packet resends its own (the others' resends are
counted duplicates at the switch): a few resends more, for recovery in one
round trip instead of a timeout. Timers remain for what no later RESULT can
reveal: the last packets of a call, and a stall.

Reordering: the margin adapts, as RACK's reordering window does (RFC 8985,
6.2). A path of several queues (a worker's lanes: docs/performance.md,
"Several queues per worker") can bring RESULTs back out of order by more
than a quarter of a round trip, and every such RESULT makes a spurious
resend and a loss for the window. The sign is TCP's DSACK: a second RESULT
of a packet resent on evidence. Both copies were answered, so nothing of
the round was lost on this rank's side (its DATA was in, its RESULT came)
and the resend was for nothing: the original's RESULT was only late, or
another rank's resend completed the round first. The second is a loss, not
reordering, and comes to about half of a rank's resends for another's lost
packet (a 5% loss at 8 ranks widened the margin of every rank and took the
time from 1.2x to 2x the loss-free one). So the resends on evidence are
judged in samples of RACK_REO_SAMPLE: where at least 3/4 were answered
twice, the margin grows by a quarter of the smoothed round trip, up to the
whole of it (`reo_mult`); where at most 1/4 were, it is a quarter again.

Copies of a lost probe: the probe whose timer runs out again (its resend
was lost too) goes as 2^(n-1) copies back to back at its n-th expiry, at
most RTO_COPIES_MAX (QUIC's probe timeout sends two datagrams for the same
reason, RFC 9002 6.2.4). Losses come in runs on real links, and while a
stream waits for its probe's answer the probe is all it sends: one copy a
doubled timeout took seconds of timers to get through a burst (calls of
6-17 s in the lab's bursts of 4 frames at 5%), copies a few timeouts. Only
the probe: the packets deferred behind it go once a timeout, so a late
rank's stall costs a few copies of one packet, not of the window. A copy
that finds its round complete is a duplicate at the box; with random loss
p a probe's n-th expiry comes with p^(n-1), so copies cost next to nothing.

The tail probe (RACK-TLP's): when no RESULT has come in and no packet gone
out for the first time for two smoothed round trips (at most the RTO) while
packets are in flight and no new one waits for its paced send time (a
call's tail, or a window or slots held by lost rounds: nothing new will go
whose RESULT could be evidence), the newest in flight goes again, once until
the next RESULT. Not while the pacer holds a packet: a stream paced slower
than a packet every two round trips (a box's share) would probe between
every two RESULTs. Its answer is evidence about
every older packet, so a lost tail costs about three round trips, not a
timeout (2 ms at least). A late rank costs one packet a stall.

`RtoEstimator` and `RetransmitTimers` are these rules in Python (the udp
backend); worker/stream.c (rtt_sample, check_timers) implements the same
rules in the afxdp engine, which takes the policy's three numbers. The
numbers both share (the engine's default timeouts, the rules' constants, the
stall timeout) are defined once, in worker/engine_policy.h, and read here
from the generated layout (docs/architecture.md, "Where Python gets the C
layouts").
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from ..layout import DEFINES

_ENGINE = DEFINES["engine_policy.h"]
RTO_BACKOFF = _ENGINE["SWML_RTO_BACKOFF"]      # an expired timer's timeout times this
RTO_QUIET_DIV = _ENGINE["SWML_RTO_QUIET_DIV"]  # RESULTs stopped: none for the RTO / this
RACK_REORDER_DIV = _ENGINE["SWML_RACK_REORDER_DIV"]  # evidence's margin: base RTT / this
RACK_MAX_BACKOFF = _ENGINE["SWML_RACK_MAX_BACKOFF"]  # resends on evidence: 2^n RTTs apart
RACK_REO_SAMPLE = _ENGINE["SWML_RACK_REO_SAMPLE"]    # resends on evidence judged together
RTO_COPIES_MAX = _ENGINE["SWML_RTO_COPIES_MAX"]      # a probe's n-th expiry: 2^(n-1) copies, at most
# A call fails when no result came in for this long (every backend's default).
STALL_TIMEOUT_S = float(_ENGINE["SWML_STALL_TIMEOUT_S"])


@dataclass(frozen=True)
class RetransmitPolicy:
    """Retransmission timeouts, in seconds (the rules are this module's)."""
    initial_s: float
    min_s: float
    max_s: float
    adaptive: bool = True

    def __post_init__(self) -> None:
        if not (0 < self.min_s <= self.initial_s <= self.max_s):
            raise ValueError(f"retransmission timeouts need 0 < min ({self.min_s:g}) <= "
                             f"initial ({self.initial_s:g}) <= max ({self.max_s:g})")

    def with_env(self, prefix: str) -> RetransmitPolicy:
        """This policy with <prefix>RTO_INITIAL / RTO_MIN / RTO_MAX (seconds)
        and <prefix>RTO_ADAPTIVE (0 or 1) from the environment where set:
        knobs for experiments."""
        changes: dict = {}
        for field, name in (("initial_s", "RTO_INITIAL"), ("min_s", "RTO_MIN"), ("max_s", "RTO_MAX")):
            value = os.environ.get(prefix + name)
            if value:
                changes[field] = float(value)
        adaptive = os.environ.get(prefix + "RTO_ADAPTIVE")
        if adaptive:
            if adaptive not in ("0", "1"):
                raise ValueError(f"{prefix}RTO_ADAPTIVE must be 0 or 1, not {adaptive!r}")
            changes["adaptive"] = adaptive == "1"
        return replace(self, **changes) if changes else self


class RtoEstimator:
    """The RTO of RFC 6298 within the policy's bounds, kept across tensors."""

    def __init__(self, policy: RetransmitPolicy):
        self.policy = policy
        self.rto = policy.initial_s
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.samples = 0

    def sample(self, rtt: float) -> None:
        """A round trip of a packet that was sent once."""
        if not self.policy.adaptive:
            return
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = (3 * self.rttvar + abs(self.srtt - rtt)) / 4
            self.srtt = (7 * self.srtt + rtt) / 8
        self.samples += 1
        self.rto = min(max(self.srtt + 4 * self.rttvar, self.policy.min_s), self.policy.max_s)

    def backoff(self, rto: float) -> float:
        """A timer of `rto` expired: its backed-off timeout, which (adaptive)
        also holds for packets sent from now on if it is longer than the
        current RTO."""
        backed_off = min(rto * RTO_BACKOFF, self.policy.max_s)
        if self.policy.adaptive:
            self.rto = max(self.rto, backed_off)
        return backed_off


class RetransmitTimers:
    """Per-packet timers of one stream; `clock` is injectable for tests."""

    def __init__(self, policy: RetransmitPolicy, clock: Callable[[], float] = time.monotonic):
        self.estimator = RtoEstimator(policy)
        self.clock = clock
        # packet -> (deadline, its timeout, first send time or None once resent
        # (Karn), first send time, latest send time, resends on evidence)
        self._timers: dict[int, tuple[float, float, float | None, float, float, int]] = {}
        self._last_answer = clock()         # when the last result came in
        self._probe: int | None = None      # the resent packet whose answer is awaited
        self._deferred: set[int] = set()    # timed out while the probe was out: not resent
        self.spurious = 0                   # probes whose original was in the round after all
        self.min_rtt = 0.0                  # the smallest round trip sampled (Karn's)
        self._rack_xmit = 0.0               # latest send time of a packet answered
        self._rack_rtt = 0.0                # ... and that answer's round trip
        self._rack_moved = False            # ... and it moved since the last look
        self._tail_armed = True             # the tail probe may go (once a result)
        self.pacing = False                 # a new packet waits for its paced time
        self._last_sent = clock()           # the last first send
        self.evidence_resends = 0           # packets resent on evidence
        self.tail_probes = 0                # packets resent as the tail probe
        self._expiries: dict[int, int] = {}  # packet -> its timer's expiries so far
        self.timeout_copies = 0             # extra copies of probes whose timer ran out again
        # RACK's margin: reo_mult quarters of the smoothed round trip, judged on
        # samples of resends on evidence (module docstring, "Reordering"), kept
        # across streams
        self.reo_mult = 1
        self.reorder_seen = 0               # resends on evidence answered twice
        self._reo_answered = self._reo_twice = 0   # this sample's resends, and those answered twice
        self._resent_answered: set[int] = set()   # answered after a resend on evidence

    def start(self) -> None:
        """A new stream: forget the timers of the last one (a failed tensor
        leaves some), keep what the estimator learnt."""
        self._timers.clear()
        self._expiries.clear()
        self._last_answer = self.clock()
        self._probe = None
        self._deferred.clear()
        self._rack_xmit = 0.0
        self._rack_moved = False
        self._tail_armed = True
        self.pacing = False
        self._resent_answered.clear()

    def sent(self, p: int) -> None:
        """Packet p went out for the first time."""
        now = self.clock()
        rto = self.estimator.rto
        self._timers[p] = (now + rto, rto, now, now, now, 0)
        self._last_sent = now

    def answered(self, p: int, lost: bool = True) -> float | None:
        """Packet p has its result: stop its timer, sample its round trip;
        returns that round trip (None for a resent packet: Karn's rule).
        `lost`: the result shows a loss (our resend completed the round, or a
        SHADOW reply); it matters for the probe only (module docstring)."""
        now = self.clock()
        self._last_answer = now
        self._tail_armed = True
        timer = self._timers.pop(p, None)
        self._expiries.pop(p, None)
        self._deferred.discard(p)
        if timer is not None and timer[5]:
            self._resent_answered.add(p)
            self._reorder_judge()
        if timer is not None and (timer[2] is not None or now - timer[4] >= self.min_rtt) \
                and timer[4] > self._rack_xmit:
            self._rack_xmit = timer[4]
            self._rack_rtt = now - timer[4]
            self._rack_moved = True
        if timer is not None and p == self._probe:
            self._probe = None
            # A loss: the deferred are due at once (and go, deferred before).
            # Else the late rank is back: a fresh timeout for its packets, and
            # no RTT sample: this round trip includes its wait (module docstring).
            for q in self._deferred:
                _, rto, first, sent0, xmit, n = self._timers[q]
                self._timers[q] = (now if lost else now + rto, rto, first, sent0, xmit, n)
            if not lost:
                self.spurious += 1
                self._deferred.clear()
        if timer is None or timer[2] is None:
            return None
        rtt = now - timer[2]
        self.estimator.sample(rtt)
        if not self.min_rtt or rtt < self.min_rtt:
            self.min_rtt = rtt
        return rtt

    def duplicate(self, p: int) -> None:
        """A second RESULT of packet p, already answered. If p went again on
        evidence, both copies were answered: the resend was for nothing
        (module docstring, "Reordering"), and the margin grows, once a round
        trip at most."""
        if p not in self._resent_answered:
            return
        self._resent_answered.discard(p)
        self.reorder_seen += 1
        self._reo_twice += 1

    def _reorder_judge(self) -> None:
        """A packet resent on evidence has its (first) RESULT: every
        RACK_REO_SAMPLE of them, the margin grows if at least 3/4 were
        answered twice, and is a quarter again if at most 1/4 were."""
        self._reo_answered += 1
        if self._reo_answered < RACK_REO_SAMPLE:
            return
        if 4 * self._reo_twice >= 3 * RACK_REO_SAMPLE:
            self.reo_mult = min(self.reo_mult + 1, RACK_REORDER_DIV)
        elif 4 * self._reo_twice <= RACK_REO_SAMPLE:
            self.reo_mult = 1
        self._reo_answered = self._reo_twice = 0

    def reorder_window(self) -> float:
        """RACK's margin: reo_mult quarters of the smoothed round trip, at most all of it."""
        srtt = self.estimator.srtt or 0.0
        return min(srtt * self.reo_mult / RACK_REORDER_DIV, srtt)

    def lost_by_evidence(self) -> list[int]:
        """The packets to resend now because a packet sent after them has its
        result (module docstring, "Loss by evidence"), each re-armed with its
        timeout as it was. Empty unless a result came in since the last look."""
        if not self._rack_moved:
            return []
        self._rack_moved = False
        now = self.clock()
        reo = self.reorder_window()
        before = self._rack_xmit - reo
        rtt = max(self._rack_rtt, self.estimator.srtt or 0.0)
        lost = sorted(p for p, timer in self._timers.items() if timer[4] < before
                      and now >= timer[4] + rtt * 2 ** min(timer[5], RACK_MAX_BACKOFF) + reo)
        for p in lost:
            _, rto, _, sent0, _, n = self._timers[p]
            self._timers[p] = (now + rto, rto, None, sent0, now, n + 1)
            self._deferred.discard(p)
        self.evidence_resends += len(lost)
        return lost

    def expired(self) -> Iterator[int]:
        """The packets to resend now, each re-armed with a doubled timeout,
        each as often as it goes (copies after a lost resend: module
        docstring).
        While results flow, every packet whose timer ran out. When they have
        stopped (none since the oldest of those packets went out, or for an
        eighth of the RTO), that packet as the probe (or the probe again) and
        those deferred before (a loss the probe found makes them due at
        once); the others are deferred once: re-armed for their timeout, not
        resent."""
        now = self.clock()
        due = sorted(p for p, timer in self._timers.items() if timer[0] <= now)
        if self._probe is None:
            oldest = next((p for p in due if p not in self._deferred), None)
            if oldest is not None and (self._timers[oldest][3] >= self._last_answer
                                       or now - self._last_answer
                                       >= self.estimator.rto / RTO_QUIET_DIV):
                self._probe = oldest
        for p in due:
            _, rto, first, sent0, xmit, n = self._timers[p]
            if self._probe is None or p == self._probe \
                    or p in self._deferred:  # deferred once, never twice
                self._deferred.discard(p)
                rto = self.estimator.backoff(rto)
                sent = self.clock()
                self._timers[p] = (sent + rto, rto, None, sent0, sent, n)
                expiries = self._expiries[p] = self._expiries.get(p, 0) + 1
                copies = min(2 ** min(expiries - 1, 8), RTO_COPIES_MAX) if p == self._probe else 1
                self.timeout_copies += copies - 1
                for _ in range(copies):
                    yield p
            else:
                self._timers[p] = (now + rto, rto, first, sent0, xmit, n)
                self._deferred.add(p)

    def _tail_probe_at(self) -> float | None:
        if self.pacing or not (self._tail_armed and self._timers and self.estimator.srtt):
            return None
        since = max(self._last_answer, self._last_sent)
        return since + min(2 * self.estimator.srtt, self.estimator.rto)

    def tail_probe(self) -> int | None:
        """The newest packet in flight, to resend now as the tail probe
        (module docstring), or None: a result came in within the probe's
        time, nothing is in flight, or it went already."""
        at = self._tail_probe_at()
        if at is None or self.clock() < at:
            return None
        self._tail_armed = False
        p = max(self._timers)
        _, rto, _, sent0, _, n = self._timers[p]
        now = self.clock()
        self._timers[p] = (now + rto, rto, None, sent0, now, n)
        self.tail_probes += 1
        return p

    def next_deadline(self) -> float | None:
        timers = (timer[0] for timer in self._timers.values())
        return min((t for t in (min(timers, default=None), self._tail_probe_at())
                    if t is not None), default=None)

    def pending(self) -> list[int]:
        """Packets still waiting for a result."""
        return list(self._timers)


# What each backend uses by default (docs/design-decisions.md, "One
# retransmission policy", has the measurements).
#
# The C engine (afxdp): 5 ms, within [2 ms, 0.5 s]; worker/engine_policy.h says why.
ENGINE_POLICY = RetransmitPolicy(initial_s=_ENGINE["SWML_RTO_INITIAL_US"] / 1e6,
                                 min_s=_ENGINE["SWML_RTO_MIN_US"] / 1e6,
                                 max_s=_ENGINE["SWML_RTO_MAX_US"] / 1e6)
# The udp loop runs Python per packet (~30 us of it at k=64, on the cores its
# peers need): adaptive, as the engine, with a floor of 5 ms that its Python
# turnaround stays well inside. Measured with `swml-lab bench --systems
# swml-udp` (50 Mbit/s, 8 MiB; docs/design-decisions.md, "One retransmission
# policy"): at 1% loss 3-4x faster than a fixed 50 ms timeout, which stalls
# the stream once a slot's worth of sending has gone by; loss-free under
# 0.05% resent; a 2 ms floor resent 0.1-0.3% loss-free, a 10 ms one was
# 1.5x slower at 1% loss.
PYTHON_POLICY = RetransmitPolicy(initial_s=0.05, min_s=0.005, max_s=1.0)
