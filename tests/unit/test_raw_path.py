"""The path's ceiling, its pure parts: swml's packets a second and their
fraction of the raw path's, the lines and the table column that show them, the
rows that get them, and the command lines' refusals (the ping-pong itself:
tests/lab/test_raw_path.py)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from clis import WORKER_CLI
from switchml_xdp import wire
from switchml_xdp.bench import raw_lab, raw_path, report
from switchml_xdp.client.plans import packets_needed

RAW = {"pps": 200_000.0, "gbps": 1.757, "frame_len": 1098, "k": 256, "window": 128,
       "rtt_us": 640.0, "lost": 0, "bad": 0}


def test_fraction_is_swml_over_raw_and_none_without_both():
    assert raw_path.fraction(150_000, 200_000) == pytest.approx(0.75)
    assert raw_path.fraction(None, 200_000) is None
    assert raw_path.fraction(150_000, 0) is None
    assert raw_path.fraction(0, 200_000) is None


@pytest.mark.parametrize("dtype, op", [("float32", "sum"), ("int32", "sum"), ("float32", "max")])
def test_swml_pps_is_the_plans_packets_over_the_time(dtype, op):
    n, k, slots = 1 << 20, 256, 128
    want = packets_needed(n, np.dtype(dtype), k, slots, wire.OPS[op]) / 0.5
    assert raw_path.swml_pps(n, k, slots, 0.5, dtype, op) == pytest.approx(want)
    if (dtype, op) == ("float32", "sum"):   # a float sum sends its exponents' packets first
        assert want == pytest.approx((4096 + 128) / 0.5)


def _bench_row(rank=0, tat=0.05):
    return {"rank": rank, "elements": 1 << 20, "k": 256, "slots": 128, "tat_median_s": tat,
            "dtype": "float32", "op": "sum", "bytes": 4 << 20}


def test_beside_prints_raw_and_each_rows_fraction():
    rows = [_bench_row(0, 0.05), _bench_row(1, 0.0422)]
    text = raw_path.beside(rows, RAW)
    first, *per_rank = text.splitlines()
    assert "200.0 kpps" in first and "1098-byte frames" in first and "k=256" in first
    assert len(per_rank) == 2
    assert rows[0]["raw_pps_fraction"] == pytest.approx((4096 + 128) / 0.05 / 200_000)
    assert f"{100 * rows[0]['raw_pps_fraction']:.1f}% of the raw path's" in per_rank[0]


def _lab_row(system, workers=2, k=256, boxes=1, status="ok", loss=0.0):
    return {"system": system, "workers": workers, "k": k, "boxes": boxes, "status": status,
            "loss": loss, "size_bytes": 4 << 20, "job_slots": 64, "tat_median_s": 0.1}


def test_annotate_gives_only_the_swml_rows_of_that_lab_and_k_their_fraction():
    rows = [_lab_row("swml-afxdp"), _lab_row("swml-udp", loss=0.01), _lab_row("userspace"),
            _lab_row("gloo"), _lab_row("swml-afxdp", k=64), _lab_row("swml-afxdp", workers=4),
            _lab_row("swml-afxdp", boxes=2), _lab_row("swml-udp", status="failed: x")]
    got = raw_lab.annotate(rows, RAW, workers=2, k=256, boxes=1)
    assert got == rows[:3]
    pps = (1 << 20) // 256 + 64
    assert rows[0]["pps"] == pytest.approx(pps / 0.1)
    assert rows[0]["raw_pps_fraction"] == pytest.approx(pps / 0.1 / 200_000, abs=1e-4)
    assert all("raw_pps_fraction" not in r for r in rows[3:])


def test_the_table_shows_the_best_swmls_share_of_raw_pps():
    assert report._raw_cell(None) == "–"
    assert report._raw_cell({"system": "swml-afxdp"}) == "–"
    assert report._raw_cell({"raw_pps_fraction": 0.7812, "raw_pps": 240_000}) == "78% of 240 kpps"


def test_bench_refuses_an_unknown_baseline():
    argv = WORKER_CLI + ["bench", "--switch", "10.0.0.1", "--job", "j", "--rank", "0",
                         "--world", "1", "--baseline", "tcp"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "'tcp' is not 'raw'" in r.stderr, r.stderr


def test_reflect_refuses_a_bad_port():
    import sys

    r = subprocess.run([sys.executable, "-m", "switchml_xdp.cli.switch", "reflect", "eth9",
                        "--port", "0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--port" in r.stderr, r.stderr
