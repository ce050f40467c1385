"""Degenerate calls (no element, one element) of every dtype, op and precision
in a job of one udp and one afxdp rank (what backend="auto" can give): both
datapaths give the same result, and the call after each is exact, so neither
desynchronises the job (docs/protocol.md, "Empty calls")."""
from __future__ import annotations

import numpy as np

from lab_jobs import run_job, skip_without_afxdp
from requires import needs_lab

BACKENDS = ["udp", "afxdp"]
# (dtype, op, precision): every combination allreduce takes (calls.check_precision).
KINDS = [("int32", "sum", "32"), ("int32", "min", "32"), ("int32", "max", "32"),
         ("float32", "sum", "32"), ("float32", "sum", "16"), ("float32", "min", "32"),
         ("float32", "max", "32")]
SHAPES = [(0,), (1,), (0, 3), ()]  # empty, one element, empty 2-D, 0-d
PLAIN = {"int32": ([7], [-3]), "float32": ([1.5], [-0.25])}  # rank 0's, rank 1's
# One element at the edges: int32 extremes (SUM wraps), non-finite floats
# (SUM gives NaN in the block; MIN and MAX as numpy's).
EDGES = {"int32": [([2**31 - 1], [1]), ([-2**31], [2**31 - 1])],
         "float32": [([np.nan], [1.0]), ([np.inf], [-2.0]), ([-np.inf], [np.inf])]}
CASES = [(shape, *kind, PLAIN[kind[0]]) for shape in SHAPES for kind in KINDS] + \
    [((1,), *kind, values) for kind in KINDS for values in EDGES[kind[0]]]
PROBE_N = 300  # two packets at k=256


def _inputs(case: int, rank: int) -> np.ndarray:
    shape, dtype, _op, _precision, values = CASES[case]
    n = int(np.prod(shape))
    scale = case + 1 if values is PLAIN[dtype] else 1
    return (np.array(values[rank][:n], dtype) * np.array(scale, dtype)).reshape(shape)


def _probe(case: int, rank: int) -> np.ndarray:
    return np.arange(PROBE_N, dtype=np.int32) * (rank + 1) + case


def _reference(case: int) -> np.ndarray:
    shape, dtype, op, _precision, _values = CASES[case]
    xs = [_inputs(case, r) for r in range(2)]
    with np.errstate(over="ignore", invalid="ignore"):
        out = {"sum": np.add, "min": np.minimum, "max": np.maximum}[op](*xs)
    if dtype == "float32" and op == "sum" and not all(np.isfinite(x).all() for x in xs):
        out[...] = np.nan  # docs/quantization.md: a non-finite input, NaN in its block
    return out


@needs_lab
def test_every_degenerate_call_agrees_across_datapaths_and_keeps_the_job_in_step(lab8, switch):
    skip_without_afxdp(BACKENDS)

    def body(rank, w):
        results = []
        for case, (shape, dtype, op, precision, _values) in enumerate(CASES):
            what = f"case {case}: {CASES[case]}"
            x = _inputs(case, rank)
            try:
                y = w.allreduce(x, op=op, precision=precision)
                probe = w.allreduce(_probe(case, rank))
            except Exception as e:
                raise AssertionError(f"rank {rank} ({w.backend_name}), {what}: {e!r}") from e
            assert y is x and y.shape == shape and y.dtype == np.dtype(dtype), what
            np.testing.assert_array_equal(probe, _probe(case, 0) + _probe(case, 1), err_msg=what)
            results.append(y.copy())
        return results, w.stats(), w._backend.next_index

    (res0, stats0, next0), (res1, stats1, next1) = run_job(lab8, "degenerate", BACKENDS, body, timeout=180)
    for case in range(len(CASES)):
        what = f"case {case}: {CASES[case]}"
        assert res0[case].tobytes() == res1[case].tobytes(), f"{what}: the datapaths differ"
        np.testing.assert_array_equal(res0[case], _reference(case), err_msg=what)
    # The same packets on both datapaths: their streams stand at the same packet.
    assert next0 == next1
    assert stats0["tensors"] == stats1["tensors"] == 2 * len(CASES)


@needs_lab
def test_an_empty_call_against_a_full_one_is_a_mismatch_on_either_datapath(lab8, switch):
    """The empty float32 sum on the afxdp rank (refused there before anything
    was sent, so the udp rank stalled and the job never came back), and on the
    udp rank, at both precisions: every rank raises CallMismatch at once, and
    the next call is exact."""
    import time

    from switchml_xdp import CallMismatch

    skip_without_afxdp(BACKENDS)
    rounds = [(empty_rank, precision) for empty_rank in (0, 1) for precision in ("32", "16")]

    def body(rank, w):
        took = []
        for case, (empty_rank, precision) in enumerate(rounds):
            x = np.ones(0 if rank == empty_rank else 100, np.float32)
            t0 = time.monotonic()
            try:
                w.allreduce(x, precision=precision)
            except CallMismatch:
                took.append(time.monotonic() - t0)
            else:
                raise AssertionError(f"rank {rank}, round {case}: no CallMismatch")
            probe = w.allreduce(_probe(case, rank))
            np.testing.assert_array_equal(probe, _probe(case, 0) + _probe(case, 1))
        return max(took)

    assert max(run_job(lab8, "degenerate-mm", BACKENDS, body)) < 5.0
