"""docs/pytorch.md, "Is it faster for my model": `python -m switchml_xdp.torch.ab`
under torchrun on two lab hosts runs an unchanged DDP training script for a
few steps with the swml backend and with Gloo, and rank 0 prints a row each:
time a step, DDP's communication time and the loss, which the quantized
switch keeps within a small difference of Gloo's."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from switchml_xdp.lab.cluster import run_rank_processes

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ab_train.py"
STEPS = 12


def test_ab_runs_the_user_s_script_with_each_backend_and_compares(lab8, switch):
    hosts = lab8.workers[:2]
    placements = [(host, [sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                          "--nproc_per_node=1", f"--node_rank={i}",
                          f"--master_addr={hosts[0].ip}", "--master_port=29561",
                          "-m", "switchml_xdp.torch.ab", "--steps", str(STEPS), "--warmup", "2",
                          "--backends", "gloo,swml", str(SCRIPT)])
                  for i, host in enumerate(hosts)]
    env = {"SWML_SWITCH": lab8.switch.ip, "PYTHONPATH": os.pathsep.join(sys.path)}
    (out0, err0), _ = run_rank_processes(lab8, placements, timeout=240, env=env)
    rows = {line.split()[0]: line.split() for line in out0.splitlines()
            if line.split() and line.split()[0] in ("swml", "gloo")}
    assert set(rows) == {"swml", "gloo"}, out0 + err0[-2000:]
    for row in rows.values():
        assert row[1] == str(STEPS), row              # every arm ran its steps
        assert float(row[2]) > 0 and row[4] != "-", row   # a time a step, DDP's comm time
    assert float(rows["gloo"][7]) == 0.0                  # the reference against itself
    assert float(rows["swml"][7]) < 0.05, rows["swml"]    # quantized sums: the same descent
