"""`swml-lab train --fsdp2`: the model sharded with FSDP2 over the swml process
group (its gradients reduce-scattered through the switch) trains to Gloo's
accuracy, every rank ends with the same parameters, and the time per epoch
of both runs is printed."""
from __future__ import annotations

import pytest

from requires import NO_LAB


def test_lab_train_with_fsdp2(tmp_path):
    pytest.importorskip("sklearn", reason="the training example needs scikit-learn (python3-sklearn)")
    pytest.importorskip("matplotlib", reason="the training example plots with matplotlib")
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab.train_example import TrainConfig
    from switchml_xdp.lab.train_runs import run_lab_training

    said = []
    res = run_lab_training(2, TrainConfig(epochs=3, parallel="fsdp2"), "udp",
                           str(tmp_path / "c.png"), out=said.append)
    swml, gloo = res["swml"], res["gloo"]
    assert swml["config"]["parallel"] == gloo["config"]["parallel"] == "fsdp2"
    assert swml["buckets"] > 0 and swml["fallback_buckets"] == 0   # through the switch
    assert swml["param_spread"] == 0.0 and gloo["param_spread"] == 0.0
    assert abs(swml["test_acc"][-1] - gloo["test_acc"][-1]) <= 1.0
    table = "\n".join(str(s) for s in said)
    assert "gloo reduce-scatter and all-gather (FSDP2)" in table and " ms " in table, table
