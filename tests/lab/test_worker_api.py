"""The Worker API's promises to its users: clear errors, not hangs, and the
`swml-worker bench` command line."""
from __future__ import annotations

import numpy as np
import pytest

from lab_jobs import bench_cli_2_ranks
from switchml_xdp.lab.cluster import run_ranks


def test_bad_arrays_are_refused_before_anything_is_sent(lab8, switch):
    from switchml_xdp import Worker

    def body(rank, host):
        with Worker(lab8.switch.ip, "api-arrays", 0, 1, backend="udp", verbose=False) as w:
            with pytest.raises(TypeError, match="float32 and int32.*float64"):
                w.allreduce(np.zeros(10))
            with pytest.raises(ValueError, match="C-contiguous"):
                w.allreduce(np.zeros((10, 10), np.float32)[:, 1])
            ro = np.zeros(4, np.int32)
            ro.flags.writeable = False
            with pytest.raises(ValueError, match="writeable"):
                w.allreduce(ro)
            with pytest.raises(TypeError, match="numpy array"):
                w.allreduce([1, 2, 3])
            a = np.arange(5, dtype=np.int32).reshape(5, 1)  # any C-contiguous shape
            assert w.allreduce(a) is a and a[4, 0] == 4
            assert w.allreduce(np.zeros(0, np.float32)).size == 0
            return w.stats()

    stats = run_ranks(lab8, lab8.workers[:1], body)[0]
    assert stats["tensors"] == 2 and stats["backend"] == "udp"


@pytest.mark.parametrize("kwargs, error", [
    ({"backend": "tcp"}, "backend must be one of"),
    ({"rank": 2, "world": 2}, "rank must be in 0..1"),
    ({"world": 0}, "world must be a positive integer"),
])
def test_bad_arguments(lab8, switch, kwargs, error):
    from switchml_xdp import Worker

    args = {"switch": lab8.switch.ip, "job": "api-args", "rank": 0, "world": 1, **kwargs}
    with pytest.raises(ValueError, match=error):
        Worker(**args)


def test_a_switch_that_does_not_answer(lab8, switch):
    from switchml_xdp import ControlError, Worker

    def body(rank, host):
        with pytest.raises(ControlError, match="cannot reach the switch's control server at 10.0.0.1:4999"):
            Worker(lab8.switch.ip, "api-noanswer", 0, 1, control_port=4999, backend="udp")

    run_ranks(lab8, lab8.workers[:1], body)


def test_other_workers_never_join(lab8, switch):
    from switchml_xdp import ControlError, Worker

    def body(rank, host):
        with pytest.raises(ControlError, match=r"timed out after 1 s waiting for rank\(s\) 1, 2"):
            Worker(lab8.switch.ip, "api-alone", 0, 3, backend="udp", join_timeout=1)

    run_ranks(lab8, lab8.workers[:1], body)


def test_bench_cli_json_and_verify(lab8, switch):
    for res in bench_cli_2_ranks(lab8, "api-bench", 48910):
        assert res["verified"] == 3 and res["verify_failures"] == 0
        assert res["bytes"] == 102400 and res["world"] == 2
        assert res["goodput_gbps"] > 0 and res["tat_min_s"] <= res["tat_median_s"] <= res["tat_max_s"]
