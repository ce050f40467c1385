"""`swml-worker bench --sweep`: size ranges as nccl-tests give them, algbw and
busbw, the table's columns. Sweeps through a switch: tests/lab/test_sweep.py."""
from __future__ import annotations

import subprocess

import pytest

from clis import WORKER_CLI
from switchml_xdp.bench.allreduce_bench import bus_factor, format_sweep, parse_sweep


def test_the_default_sweep_is_4KiB_to_256MiB_in_powers_of_two():
    sizes = parse_sweep("4KiB:256MiB")
    assert sizes[0] == 4096 and sizes[-1] == 256 * 2**20 and len(sizes) == 17
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


@pytest.mark.parametrize("text, sizes", [
    ("4KiB:64KiB:4", [4096, 16384, 65536]),
    ("4KiB:100KiB:4", [4096, 16384, 65536]),  # MAX need not be on the ladder
    ("1MiB:1MiB", [2**20]),
    ("4096:8192", [4096, 8192]),
])
def test_sweep_forms(text, sizes):
    assert parse_sweep(text) == sizes


@pytest.mark.parametrize("text, error", [
    ("4KiB", "not a sweep"), ("1MiB:4KiB", "MAX is smaller"), ("4KiB:1MiB:1", "at least 2"),
    ("4KiB:1MiB:x", "not an integer"), ("4KiB:12 parsecs", "not a size"),
])
def test_bad_sweeps(text, error):
    with pytest.raises(ValueError, match=error):
        parse_sweep(text)


def test_busbw_is_algbw_times_2_n_minus_1_over_n_as_in_nccl_tests():
    assert [bus_factor(n) for n in (1, 2, 4, 8)] == [0, 1, 1.5, 1.75]


def test_the_table_has_nccl_tests_columns_and_says_what_busbw_is():
    rows = [{"rank": 0, "world": 4, "backend": "udp", "k": 256, "iterations": 3, "bytes": b,
             "elements": b // 4, "dtype": "float32", "op": "sum", "tat_mean_s": t,
             "algbw_gbs": b / t / 1e9, "busbw_gbs": 1.5 * b / t / 1e9, "verified": None,
             "verify_failures": None, "retransmissions": 2}
            for b, t in ((4096, 1e-3), (8192, 1e-3))]
    text = format_sweep(rows)
    head = text.splitlines()[1].split()
    assert head == ["#", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong",
                    "retx"]
    row = text.splitlines()[3].split()
    assert row == ["4096", "1024", "float32", "sum", "1000.0", "0.004", "0.006", "N/A", "2"]
    assert "busbw = algbw * 2(n-1)/n = algbw * 1.500" in text
    assert "Avg bus bandwidth" in text


def test_a_bare_sweep_flag_is_the_default_range():
    r = subprocess.run(WORKER_CLI + ["bench", "--switch", "10.0.0.1", "--job", "j", "--rank", "3",
                                     "--world", "2", "--sweep"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "rank 3 must be < world 2" in r.stderr, r.stderr
    r = subprocess.run(WORKER_CLI + ["bench", "--switch", "10.0.0.1", "--job", "j", "--rank", "0",
                                     "--world", "2", "--sweep", "4KiB"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "not a sweep" in r.stderr, r.stderr
