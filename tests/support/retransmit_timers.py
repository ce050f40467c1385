"""A fake clock and retransmission timers on it, for the tests of the one
retransmission policy (switchml_xdp/client/retransmit.py)."""
from __future__ import annotations

from switchml_xdp.client.retransmit import RetransmitPolicy, RetransmitTimers


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def engine_like_timers() -> tuple[FakeClock, RetransmitTimers]:
    """Adaptive timers from 5 ms, 2 ms to 0.5 s, on a fake clock."""
    clock = FakeClock()
    return clock, RetransmitTimers(RetransmitPolicy(initial_s=0.005, min_s=0.002, max_s=0.5),
                                   clock)


FIXED_POLICY = RetransmitPolicy(initial_s=0.05, min_s=0.05, max_s=1.0, adaptive=False)
