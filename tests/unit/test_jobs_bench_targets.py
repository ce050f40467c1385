"""The competing-jobs bench's arithmetic, without a lab: the targets the share
policies are held to, worked out from a document
(switchml_xdp/bench/jobs_targets.py), and the weighted run's figures from
the box's sampled byte counters: rate ratios over the steady parts and the
settling after a change of weights (switchml_xdp/bench/jobs_weighted.py).
The spec's syntax: tests/unit/test_jobs_bench_spec.py."""
from __future__ import annotations

import pytest

from switchml_xdp.bench.jobs_targets import mix_of, target_lines, targets
from switchml_xdp.bench.jobs_weighted import (
    SAMPLE_S,
    bytes_at,
    rates_mbit,
    ratio,
    sample_of,
    settle_s,
    weighted_figures,
)


def _policy(share, done, busy, rates=None):
    return {"share": share, "jobs": [{"completion_s": t} for t in done],
            "average_s": sum(done) / len(done), "last_s": max(done), "box_busy": busy,
            "rates": rates}


def _by_name(found):
    return {t["name"]: t for t in found}


def test_srpt_is_held_to_fair_and_every_policy_to_a_busy_link():
    doc = {"policies": [_policy("none", [15, 27, 43, 57], 0.987), _policy("fair", [14, 25, 40, 54], 0.97),
                        _policy("srpt", [3, 10, 23, 56.9], 0.94)],
           "ideal_s": {"fair": [14.4, 25.2, 39.6, 54.0], "srpt": [3.6, 10.8, 25.2, 54.0]},
           "reweight": None}
    found = _by_name(targets(doc))
    avg = (3 + 10 + 23 + 56.9) / (14 + 25 + 40 + 54)
    assert found["srpt_average"]["value"] == pytest.approx(avg) and found["srpt_average"]["pass"]
    assert found["srpt_last"]["value"] == pytest.approx(56.9 / 54) and not found["srpt_last"]["pass"]
    assert found["box_busy"]["value"] == pytest.approx(0.94) and not found["box_busy"]["pass"]
    assert "none 98.7%, fair 97.0%, srpt 94.0%" in found["box_busy"]["says"]
    worst = max(t / f for t, f in zip([3, 10, 23, 56.9], [14.4, 25.2, 39.6, 54.0]))
    assert found["srpt_starve"]["value"] == pytest.approx(worst) and found["srpt_starve"]["pass"]
    assert "job 3 the furthest" in found["srpt_starve"]["says"]
    assert found["weighted_ratio"]["pass"] is None and found["reweight_settle"]["pass"] is None
    lines = target_lines(targets(doc), mix_of("2x2MiB,2x4MiB,2x8MiB,2x16MiB", 10))
    assert lines[0] == "  targets:"
    # an ideal box's own ratios beside: on this mix srpt's ideal average is 0.703x fair's
    assert "    PASS srpt's average completion 0.70x fair's (at most 0.7x, an ideal box's 0.70x)" \
        in lines, lines
    assert "(at most 1.05x, an ideal box's 1.00x)" in found["srpt_last"]["says"]
    assert any(x.startswith("    MISS srpt's last completion 1.05x") for x in lines), lines
    assert any(x.startswith("    not measured: rates by weight") for x in lines), lines
    assert "this mix is 2x2MiB,2x4MiB,2x8MiB,2x16MiB, 3 iterations)" in \
        target_lines([], mix_of("2x2MiB,2x4MiB,2x8MiB,2x16MiB", 3))[0]


def test_a_starving_job_under_srpt_misses():
    doc = {"policies": [_policy("srpt", [1, 2, 9], 0.99)], "ideal_s": {"fair": [3, 4, 4.4]},
           "reweight": None}
    found = _by_name(targets(doc))
    assert found["srpt_starve"]["value"] == pytest.approx(9 / 4.4) and not found["srpt_starve"]["pass"]
    assert found["srpt_average"]["pass"] is None and "needs --share fair,srpt" in \
        found["srpt_average"]["says"]
    unmeasured = _by_name(targets({"policies": [], "ideal_s": None, "reweight": None}))
    assert unmeasured["srpt_starve"]["pass"] is None and "box_busy" not in unmeasured


def _samples(rates_of, until, dt=SAMPLE_S):
    """Cumulative bytes of two jobs whose rates (bytes/s) rates_of(t) gives, every dt."""
    out, got, t = [], [0.0, 0.0], 0.0
    while t <= until + 1e-9:
        out.append({"t": t, "bytes": [round(got[0]), round(got[1])], "share": [None, None]})
        r = rates_of(t)
        got = [got[0] + r[0] * dt, got[1] + r[1] * dt]
        t += dt
    return out


def test_the_ratio_over_the_steady_part_and_the_settling_after_a_change():
    # 3:1 until the change at 5 s, 1:1 from 5.4 s on (the box took 0.4 s), the first job done at 12 s
    samples = _samples(lambda t: (7.5e6, 2.5e6) if t < 5.4 - 1e-9 else (5e6, 5e6), 12)
    assert bytes_at(samples, 0, 1.0) == pytest.approx(7.5e6, rel=1e-3)
    assert bytes_at(samples, 0, 99) is None
    assert ratio(samples, 1.0, 5.0) == pytest.approx(3.0, rel=1e-3)
    fig = weighted_figures(samples, (3, 1), 12.0, (1, 1), (4.6, 5.0))   # the command took 0.4 s
    assert fig["ratio"] == pytest.approx(3.0, rel=1e-3) and fig["target"] == 3
    assert (fig["from_s"], fig["to_s"]) == (1.0, 4.6)
    after = fig["after"]
    assert after["ratio"] == pytest.approx(1.0, rel=1e-3) and after["target"] == 1
    # within 10% of 1:1 once the 0.3 s window holds only the new rates: 5.4 + 0.3 -> 5.7
    assert after["settle_s"] == pytest.approx(0.7, abs=SAMPLE_S / 2)
    assert after["with_command_s"] == pytest.approx(after["settle_s"] + 0.4)
    ts, rs = rates_mbit(samples, 1)
    assert rs[ts.index(min(t for t in ts if t > 3))] == pytest.approx(20.0, rel=1e-2)
    doc = {"policies": [_policy("weighted", [12, 16], 0.99, {"figures": fig})], "ideal_s": None,
           "reweight": (1, 1)}
    found = _by_name(targets(doc))
    assert found["weighted_ratio"]["pass"] and found["weighted_ratio"]["value"] < 0.01
    assert found["reweight_settle"]["pass"] and "weights set to 1:1" in found["reweight_settle"]["says"]
    assert "after swml-switch job returned (1.10 s after it began)" in found["reweight_settle"]["says"]


def test_weights_that_never_take_hold_miss():
    samples = _samples(lambda t: (6e6, 4e6), 12)     # 1.5:1 all along, for weights 3:1 then 1:1
    fig = weighted_figures(samples, (3, 1), 12.0, (1, 1), (5.0, 5.0))
    assert settle_s(samples, 5.0, 11.8, 1.0) is None and fig["after"]["settle_s"] is None
    found = _by_name(targets({"policies": [_policy("weighted", [12, 16], 0.99, {"figures": fig})],
                              "ideal_s": None, "reweight": (1, 1)}))
    assert not found["weighted_ratio"]["pass"] and found["weighted_ratio"]["value"] == pytest.approx(0.5)
    assert not found["reweight_settle"]["pass"] and "never settled" in found["reweight_settle"]["says"]
    no_change = weighted_figures(samples, (3, 1), 12.0, None, None)
    assert "after" not in no_change and no_change["to_s"] == pytest.approx(11.8)


def test_a_sample_is_each_jobs_bytes_and_share_by_name():
    status = {"jobs": [{"name": "job1", "id": 7, "share": {"policy": "weighted", "weight": 1}},
                       {"name": "job0", "id": 3, "share": {"policy": "weighted", "weight": 3}},
                       {"name": "other", "id": 4}],
              "job_stats": {"3": {"bytes": 100, "packets": 1}, "7": {"bytes": 50, "packets": 1}}}
    s = sample_of(status, 3, 1.25)
    assert s == {"t": 1.25, "bytes": [100, 50, None],
                 "share": [{"policy": "weighted", "weight": 3}, {"policy": "weighted", "weight": 1},
                           None]}
    assert sample_of({"jobs": [], "job_stats": None}, 1, 0)["bytes"] == [None]
    assert ratio([{"t": 0, "bytes": [None, 1]}, {"t": 1, "bytes": [None, 2]}], 0, 1) is None


def test_a_blip_after_the_change_does_not_undo_the_settling_but_a_lasting_drift_does():
    def rates(t, drift=False):
        if 5.9 <= t < 6.05:
            return (3.5e6, 5e6)           # one sample interval off (0.7:1)
        if drift and t >= 6.0:
            return (6.5e6, 5e6)           # 1.3:1 from then on
        return (7.5e6, 2.5e6) if t < 5.4 - 1e-9 else (5e6, 5e6)
    blip = weighted_figures(_samples(rates, 12), (3, 1), 12.0, (1, 1), (5.0, 5.0))
    assert blip["after"]["settle_s"] == pytest.approx(0.7, abs=SAMPLE_S / 2)
    drift = _samples(lambda t: rates(t, drift=True), 12)
    assert weighted_figures(drift, (3, 1), 12.0, (1, 1), (5.0, 5.0))["after"]["settle_s"] is None


def test_a_job_between_two_calls_is_left_out_of_the_ratio_with_its_tail_and_restart():
    def rates(t):
        if 7.7 <= t < 8.0 or 9.0 <= t < 9.3:
            return (2e6, 8e6)             # its call's tail, its restart
        if 8.0 <= t < 9.0:
            return (0.0, 10e6)            # checking its result: the other job takes the link
        return (7.5e6, 2.5e6) if t < 5.4 - 1e-9 else (5e6, 5e6)
    samples = _samples(rates, 12)
    fig = weighted_figures(samples, (3, 1), 12.0, (1, 1), (5.0, 5.0))
    assert fig["after"]["ratio"] == pytest.approx(1.0, rel=1e-3)
    assert fig["after"]["settle_s"] == pytest.approx(0.7, abs=SAMPLE_S / 2)
    assert ratio(samples, 7.9, 9.1) is None          # no time both jobs sent steadily
