"""`swml-worker bench` refuses bad input with one line, before joining anything."""
from __future__ import annotations

import subprocess

import pytest

from clis import WORKER_CLI


@pytest.mark.parametrize("args, error", [
    (["--size", "12 parsecs"], "not a size"),
    (["--rank", "3", "--world", "2"], "rank 3 must be < world 2"),
    (["--dtype", "float64"], "'float64' is not one of"),
])
def test_bench_cli_bad_input(args, error):
    base = {"--switch": "10.0.0.1", "--job": "j", "--rank": "0", "--world": "1"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    argv = WORKER_CLI + ["bench"] + [x for kv in base.items() for x in kv]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and error in r.stderr, r.stderr


def test_bench_cli_refuses_an_unknown_op():
    import sys

    r = subprocess.run([sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch",
                        "10.0.0.1", "--job", "j", "--rank", "0", "--world", "1", "--op", "avg"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "'avg' is not one of 'sum', 'min', 'max'" in r.stderr, r.stderr
