"""The one retransmission policy (switchml_xdp/client/retransmit.py) on a fake
clock: RFC 6298 estimates within the bounds, backoff and Karn, probes and
deferral, the udp policy and its knobs; and the one abort contract."""
from __future__ import annotations

import pytest

from retransmit_timers import FIXED_POLICY, FakeClock, engine_like_timers
from switchml_xdp.client.abort import AbortSignal, JobAborted
from switchml_xdp.client.retransmit import (
    ENGINE_POLICY,
    PYTHON_POLICY,
    RetransmitPolicy,
    RetransmitTimers,
    RtoEstimator,
)


def test_abort_signal_keeps_the_first_reason_and_calls_listeners_once():
    sig, heard = AbortSignal(), []
    sig.raise_if_set("j")  # not aborted: nothing happens
    sig.on_abort(heard.append)
    assert sig.set("rank 1 failed") and not sig.set("the switch went down")
    assert sig.reason == "rank 1 failed" and heard == ["rank 1 failed"]
    late = []
    sig.on_abort(late.append)  # registered after the fact: told at once
    assert late == ["rank 1 failed"]
    with pytest.raises(JobAborted, match=r"^job 'j' aborted: rank 1 failed$"):
        sig.raise_if_set("j")


def test_job_aborted_is_one_class_wherever_it_is_imported_from():
    from switchml_xdp import JobAborted as Public
    from switchml_xdp.client.control import JobAborted as FromControl

    assert Public is FromControl is JobAborted


def test_policy_bounds_are_checked_and_env_overrides_apply(monkeypatch):
    with pytest.raises(ValueError, match="min"):
        RetransmitPolicy(initial_s=0.001, min_s=0.002, max_s=0.5)
    with pytest.raises(ValueError, match="max"):
        RetransmitPolicy(initial_s=0.005, min_s=0.002, max_s=0.001)
    monkeypatch.setenv("SWML_AFXDP_RTO_MIN", "0.004")
    monkeypatch.setenv("SWML_AFXDP_RTO_INITIAL", "0.01")
    p = ENGINE_POLICY.with_env("SWML_AFXDP_")
    assert (p.initial_s, p.min_s, p.max_s, p.adaptive) == (0.01, 0.004, 0.5, True)
    assert ENGINE_POLICY.with_env("SWML_NOTSET_") == ENGINE_POLICY


def test_estimator_is_rfc6298_within_the_policy_bounds():
    pol = RetransmitPolicy(initial_s=0.005, min_s=0.002, max_s=0.5)
    est = RtoEstimator(pol)
    assert est.rto == 0.005  # no sample yet
    est.sample(0.010)  # first: srtt = r, rttvar = r/2, rto = 3r
    assert est.srtt == pytest.approx(0.010) and est.rttvar == pytest.approx(0.005)
    assert est.rto == pytest.approx(0.030)
    est.sample(0.002)  # rttvar = 3/4 rttvar + 1/4 |srtt - r|, srtt = 7/8 srtt + 1/8 r
    assert est.rttvar == pytest.approx(0.75 * 0.005 + 0.25 * 0.008)
    assert est.srtt == pytest.approx(0.875 * 0.010 + 0.125 * 0.002)
    assert est.rto == pytest.approx(est.srtt + 4 * est.rttvar)
    for _ in range(200):
        est.sample(0.0001)
    assert est.rto == 0.002  # the floor
    for _ in range(5):
        est.sample(3.0)
    assert est.rto == 0.5  # the cap


def test_timers_double_on_expiry_keep_the_backoff_and_follow_karn():
    clock = FakeClock()
    timers = RetransmitTimers(RetransmitPolicy(initial_s=0.005, min_s=0.002, max_s=0.05,
                                               adaptive=True), clock)
    timers.sent(0)
    timers.sent(1)
    assert timers.next_deadline() == pytest.approx(100.005)
    clock.t += 0.004
    assert list(timers.expired()) == []
    clock.t += 0.001
    # Both due: the oldest goes as the probe, its timeout doubled; the other waits.
    assert list(timers.expired()) == [0]
    assert timers._timers[0][:2] == (pytest.approx(clock.t + 0.010), pytest.approx(0.010))
    assert timers._timers[1][:2] == (pytest.approx(clock.t + 0.005), pytest.approx(0.005))
    # RFC 6298 5.5/5.7: the backed-off timeout holds for new packets too.
    assert timers.estimator.rto == pytest.approx(0.010)
    timers.sent(2)
    assert timers._timers[2][:2] == (pytest.approx(clock.t + 0.010), pytest.approx(0.010))
    for expected in (0.020, 0.040, 0.050, 0.050):  # doubling, up to the cap
        clock.t += 1.0
        assert 0 in list(timers.expired())
        assert timers._timers[0][1] == pytest.approx(expected)
    clock.t += 0.003
    timers.answered(0)  # resent: no sample (Karn)
    assert timers.estimator.samples == 0
    timers.start()  # a new stream forgets old timers, keeps the estimate
    assert timers.pending() == [] and timers.estimator.rto == pytest.approx(0.050)
    timers.sent(7)
    clock.t += 0.001
    timers.answered(7)  # sent once: sampled, and the estimate comes back down
    assert timers.estimator.samples == 1
    assert timers.estimator.rto == pytest.approx(0.003)
    assert timers.pending() == [] and timers.next_deadline() is None


def test_a_straggler_costs_one_probe_not_a_window_of_resends():
    """Every packet in flight times out because another rank is late: one
    probe goes; its answer shows the original was in the round (not our rank's
    completion, no SHADOW): spurious, and nothing else is resent."""
    clock, timers = engine_like_timers()
    for p in range(5):
        timers.sent(p)
    clock.t += 0.006
    assert list(timers.expired()) == [0]
    clock.t += 0.003   # the others are deferred for their 5 ms: none goes
    assert list(timers.expired()) == []
    clock.t += 0.001
    assert timers.answered(0, lost=False) is None  # resent: the window gets no sample
    assert timers.spurious == 1
    assert timers.estimator.samples == 0  # its round trip includes the late rank's wait
    clock.t += 0.004   # past their deferral: a fresh timeout since the late rank is back
    assert list(timers.expired()) == []
    for p in range(1, 5):
        assert timers.answered(p, lost=False) == pytest.approx(0.014)  # sent once: samples
    assert timers.pending() == []


def test_while_results_flow_a_timeout_is_a_loss_and_goes_at_once():
    """Results keep coming in after packets 0 and 1 went out: their timeouts
    mean losses, both are resent together, no probe holds either back."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    timers.sent(1)
    for p in range(2, 14):
        timers.sent(p)
        clock.t += 0.0005
        timers.answered(p, lost=False)
    assert list(timers.expired()) == [0, 1]
    assert timers.spurious == 0


def test_a_timeout_long_after_the_last_result_is_a_stall():
    clock, timers = engine_like_timers()
    timers.sent(0)
    timers.sent(1)
    timers.sent(2)
    clock.t += 0.001
    timers.answered(2, lost=False)  # came in after 0 and 1 went out, but long ago:
    clock.t += 0.005
    assert list(timers.expired()) == [0]  # 1 is held back behind the probe


def test_after_a_spurious_probe_the_deferred_get_a_fresh_timeout():
    clock, timers = probing_three()
    clock.t += 0.003
    timers.answered(0, lost=False)  # the late rank is back
    assert timers._timers[1][0] == pytest.approx(clock.t + timers._timers[1][1])
    clock.t += 0.001
    assert list(timers.expired()) == []


def test_a_probe_that_finds_a_loss_releases_the_deferred_at_once():
    clock, timers = probing_three()
    clock.t += 0.001
    timers.answered(0, lost=True)  # our resend completed the round: 0 was lost
    assert timers.spurious == 0 and timers.estimator.samples == 0
    assert list(timers.expired()) == [1, 2]  # no need to wait for their timers again
    clock.t += 0.001
    timers.answered(1, lost=True)            # not the probe: nothing else changes
    assert list(timers.expired()) == []
    clock.t += 0.030
    # the next probe, alone; its first resend was lost too: two copies
    assert list(timers.expired()) == [2, 2]


def test_a_packet_is_deferred_once_never_twice():
    """Two ranks that each lost a packet: each rank's probe may need the very
    packet the other rank defers. A deferred packet goes when its timer runs
    out a second time, probe or not (no deadlock)."""
    clock, timers = engine_like_timers()
    timers.sent(0)
    clock.t += 0.001
    timers.sent(1)
    clock.t += 0.0045
    assert list(timers.expired()) == [0]      # 1 is not due yet
    clock.t += 0.001
    assert list(timers.expired()) == []       # 1 is due: deferred behind the probe
    clock.t += 0.005                          # 1's timer runs out again (0's: 10 ms)
    assert list(timers.expired()) == [1]
    clock.t += 0.001
    timers.answered(1, lost=False)            # not the probe: no verdict drawn from it
    assert timers.spurious == 0


def test_the_udp_policy_is_adaptive_with_a_5_ms_floor():
    """Fast round trips bring the udp backend's timeout down to 5 ms, not
    below: its Python turnaround stays well inside that (retransmit.py)."""
    assert PYTHON_POLICY.adaptive
    assert (PYTHON_POLICY.initial_s, PYTHON_POLICY.min_s, PYTHON_POLICY.max_s) == (0.05, 0.005, 1.0)
    clock = FakeClock()
    timers = RetransmitTimers(PYTHON_POLICY, clock)
    for p in range(20):
        timers.sent(p)
        clock.t += 0.0002
        timers.answered(p)
    assert timers.estimator.rto == 0.005


def test_the_udp_policy_takes_the_environment_s_knobs(monkeypatch):
    from switchml_xdp.client.udp_backend import ENV_PREFIX

    monkeypatch.setenv(ENV_PREFIX + "RTO_ADAPTIVE", "0")
    monkeypatch.setenv(ENV_PREFIX + "RTO_MIN", "0.01")
    policy = PYTHON_POLICY.with_env(ENV_PREFIX)
    assert not policy.adaptive and policy.min_s == 0.01 and policy.initial_s == 0.05
    monkeypatch.setenv(ENV_PREFIX + "RTO_ADAPTIVE", "yes")
    with pytest.raises(ValueError, match="RTO_ADAPTIVE must be 0 or 1"):
        PYTHON_POLICY.with_env(ENV_PREFIX)


def test_a_fixed_policy_doubles_per_packet_and_starts_every_packet_at_initial():
    """A fixed 50 ms first timeout, doubling to 1 s (the udp backend's policy
    until the probe rule and run-quantizing plans made an adaptive one pay)."""
    clock = FakeClock()
    timers = RetransmitTimers(FIXED_POLICY, clock)
    timers.sent(0)
    for expected, copies in zip((0.1, 0.2, 0.4, 0.8, 1.0, 1.0), (1, 2, 4, 4, 4, 4)):
        clock.t += 2.0
        assert list(timers.expired()) == [0] * copies  # a lost resend: copies
        assert timers.next_deadline() == pytest.approx(clock.t + expected)
    timers.sent(1)  # no carry-over of the backed-off timeout
    assert timers._timers[1][1] == 0.05
    clock.t += 0.001
    timers.answered(1)  # no samples either
    assert timers.estimator.samples == 0 and timers.estimator.rto == 0.05


def probing_three() -> tuple[FakeClock, RetransmitTimers]:
    """Packets 0-2 out, then a stall: 0 is the probe, 1 and 2 are deferred."""
    clock, timers = engine_like_timers()
    for p in range(3):
        timers.sent(p)
    clock.t += 0.006
    assert list(timers.expired()) == [0]
    return clock, timers
