"""Streaming plans (switchml_xdp/client/plans.py) for float sums: blocks are
quantized in runs once their exponents are known, and the RESULTs turned into
sums once at the end, giving quant.simulate_allreduce (and its 16-bit twin) bit for bit."""
from __future__ import annotations

import numpy as np

from switchml_xdp import wire
from switchml_xdp.client.plans import make_plan


def _stream_sum_plans(plans, window: int, rng, combine) -> None:
    """Drive float sum plans as a backend and the switch do: new packets in
    order, each only once p - S and p - lag have their results, at most
    `window` in flight, RESULTs coming back in a shuffled order, one resend
    (the same payload again) now and then. The switch's step: `combine` of
    the payloads, the max exponent, the OR of the flags."""
    S, N = plans[0].lag, plans[0].npackets
    done = np.zeros(N, dtype=bool)
    in_flight: dict[int, list] = {}
    next_new = 0
    while not done.all():
        while (next_new < N and len(in_flight) < window
               and (next_new < S or done[next_new - S])):
            in_flight[next_new] = [pl.payload(next_new) for pl in plans]
            next_new += 1
        p = int(rng.choice(list(in_flight)))
        if rng.random() < 0.1:   # a resend: the plan must give the same payload again
            again = [pl.payload(p) for pl in plans]
            for (q0, e0, f0), (q1, e1, f1) in zip(in_flight[p], again):
                assert np.array_equal(q0, q1) and (e0, f0) == (e1, f1)
        sent = in_flight.pop(p)
        agg = combine([q for q, _, _ in sent])
        exp = max(e for _, e, _ in sent)
        flags = 0
        for _, _, f in sent:
            flags |= f
        for pl in plans:
            pl.result(p, agg, exp, flags)
        done[p] = True
    for pl in plans:
        pl.finish()


def test_float32_sum_plans_quantize_in_runs_and_give_the_reference_sum(monkeypatch):
    """A float32 sum plan quantizes blocks in runs once their exponents are
    known, not one block a packet (numpy's cost a call is what a Python
    backend pays per packet), and the result is still the reference's bit
    for bit, whatever order the RESULTs come back in."""
    from switchml_xdp import quant

    rng = np.random.default_rng(11)
    n, k, slots, world = 20000, 64, 32, 3
    xs = [(rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(np.float32)
          for _ in range(world)]
    xs[1][100] = np.inf
    calls = []
    real = quant.quantize
    monkeypatch.setattr(quant, "quantize", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    outs = [x.copy() for x in xs]
    plans = [make_plan(o, k, slots, world) for o in outs]
    _stream_sum_plans(plans, window=8, rng=rng, combine=quant.switch_sum)
    expect = quant.simulate_allreduce(xs, k)
    for o in outs:
        assert np.array_equal(o, expect, equal_nan=True)
    # Runs of lag - window blocks when RESULTs come in order; shorter when
    # shuffled as here, and still a small share of one call a block.
    blocks = plans[0].blocks
    assert len(calls) * 8 <= world * blocks, (len(calls), blocks)


def test_16_bit_sum_plans_quantize_in_runs_and_give_the_reference_sum():
    from switchml_xdp import quant16

    rng = np.random.default_rng(12)
    n, k, slots, world = 5000, 32, 16, 2
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(world)]
    outs = [x.copy() for x in xs]
    plans = [make_plan(o, k, slots, world, wire.OP_SUM, wire.FMT_INT16) for o in outs]
    _stream_sum_plans(plans, window=6, rng=rng,
                      combine=lambda qs: quant16.switch_sum16(qs, world))
    expect = quant16.simulate_allreduce16(xs, k)
    for o in outs:
        assert np.array_equal(o, expect)
