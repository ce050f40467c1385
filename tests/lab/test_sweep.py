"""`swml-worker bench --sweep`: the sizes it takes, the nccl-tests table it
prints (algbw, busbw = algbw * 2(n-1)/n), and a small sweep in the lab."""
from __future__ import annotations

import json
import subprocess

import pytest

from clis import WORKER_CLI


def _bench(lab, argv, ranks=2):
    procs = [lab.popen(h, argv + ["--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True) for r, h in enumerate(lab.workers[:ranks])]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_a_small_sweep_in_the_lab_json_and_verified(lab8, switch):
    argv = WORKER_CLI + ["bench", "--switch", lab8.switch.ip, "--job", "sweep-json", "--world", "2",
                         "--sweep", "4KiB:256KiB:4", "--iterations", "2", "--warmup", "1",
                         "--verify", "--json", "--backend", "udp", "--port", "48911"]
    for out in _bench(lab8, argv):
        rows = json.loads(out)
        assert [r["bytes"] for r in rows] == [4096, 16384, 65536, 262144]
        for r in rows:
            assert r["verified"] == 3 and r["verify_failures"] == 0
            assert r["algbw_gbs"] == pytest.approx(r["bytes"] / r["tat_mean_s"] / 1e9)
            assert r["busbw_gbs"] == pytest.approx(r["algbw_gbs"])  # 2(n-1)/n = 1 at n=2
            assert r["retransmissions"] >= 0


def test_a_small_sweep_in_the_lab_prints_the_table(lab8, switch):
    argv = WORKER_CLI + ["bench", "--switch", lab8.switch.ip, "--job", "sweep-table",
                         "--world", "2", "--sweep", "4KiB:8KiB", "--iterations", "2", "--warmup", "0", "-q",
                         "--backend", "udp", "--port", "48912"]
    for out in _bench(lab8, argv):
        print(out)
        lines = out.splitlines()
        data = [line.split() for line in lines if not line.startswith("#")]
        assert [int(d[0]) for d in data] == [4096, 8192], out
        assert all(float(d[4]) > 0 and float(d[6]) == float(d[5]) for d in data), out  # n=2: equal
        assert lines[-1].startswith("# time: mean over the iterations"), out
