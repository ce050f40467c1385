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
CASES = [(shape, *kind) for shape in SHAPES for kind in KINDS]
PROBE_N = 300  # two packets at k=256


def _inputs(case: int, rank: int, shape, dtype: str) -> np.ndarray:
    values = {0: [1.5], 1: [-0.25]} if dtype == "float32" else {0: [7], 1: [-3]}
    n = int(np.prod(shape))
    return (np.array(values[rank][:n], dtype) * (case + 1)).reshape(shape)


def _probe(case: int, rank: int) -> np.ndarray:
    return np.arange(PROBE_N, dtype=np.int32) * (rank + 1) + case


def _reference(case: int, shape, dtype: str, op: str) -> np.ndarray:
    xs = [_inputs(case, r, shape, dtype) for r in range(2)]
    return {"sum": np.add, "min": np.minimum, "max": np.maximum}[op](*xs)


@needs_lab
def test_every_degenerate_call_agrees_across_datapaths_and_keeps_the_job_in_step(lab8, switch):
    skip_without_afxdp(BACKENDS)

    def body(rank, w):
        results = []
        for case, (shape, dtype, op, precision) in enumerate(CASES):
            what = f"case {case}: shape {shape} {dtype} {op} precision {precision}"
            x = _inputs(case, rank, shape, dtype)
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
    for case, (shape, dtype, op, precision) in enumerate(CASES):
        what = f"case {case}: shape {shape} {dtype} {op} precision {precision}"
        assert res0[case].tobytes() == res1[case].tobytes(), f"{what}: the datapaths differ"
        np.testing.assert_array_equal(res0[case], _reference(case, shape, dtype, op), err_msg=what)
    # The same packets on both datapaths: their streams stand at the same packet.
    assert next0 == next1
    assert stats0["tensors"] == stats1["tensors"] == 2 * len(CASES)
