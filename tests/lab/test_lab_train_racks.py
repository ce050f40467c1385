"""`swml-lab train --racks` (switchml_xdp/lab/train_runs.py): DDP training
through a tree of boxes, each rank's SWML_SWITCH its own rack's box, trains
as Gloo does; and a box of the tree lost mid-run (a rack box killed, or the
parent powered off) sends every rank of every rack to Gloo within 2 s, each
warning why, and the training goes on to the end with the same parameters
on every rank (docs/scale-out.md, "Racks in the lab"; docs/pytorch.md, "A
lost box")."""
from __future__ import annotations

import pytest

from requires import NO_LAB

RACKS = [2, 2]
NOTICED_S = 2.0


def _train(tmp_path, epochs: int, batch: int, kill=None) -> tuple[dict, str]:
    pytest.importorskip("torch", reason="PyTorch is an optional extra: pip install -e '.[torch]'")
    pytest.importorskip("sklearn", reason="the training example needs scikit-learn (python3-sklearn)")
    pytest.importorskip("matplotlib", reason="the training example plots with matplotlib")
    if NO_LAB:
        pytest.skip(f"lab tests: {NO_LAB}")
    from switchml_xdp.lab.train_example import TrainConfig
    from switchml_xdp.lab.train_runs import run_lab_training

    said: list[str] = []
    res = run_lab_training(cfg=TrainConfig(epochs=epochs, batch=batch, racks=RACKS), backend="udp",
                           png=str(tmp_path / "c.png"), out=said.append, kill=kill, timeout=120)
    return res, "\n".join(str(s) for s in said)


def test_train_through_the_racks_trains_as_gloo_does(tmp_path):
    res, said = _train(tmp_path, epochs=2, batch=64)
    swml, gloo = res["swml"], res["gloo"]
    assert swml["config"]["racks"] == RACKS and swml["world"] == 4
    assert swml["worker"]["job_world"] == 4 and swml["worker"]["packets_sent"] > 0, swml["worker"]
    assert swml["buckets"] > 0 and swml["fallback_buckets"] == 0      # through the rack boxes
    assert swml["param_spread"] == 0.0 and gloo["param_spread"] == 0.0
    assert abs(swml["test_acc"][-1] - gloo["test_acc"][-1]) <= 1.0, said
    assert "racks 2,2 (tree), parent 10.0.0.1, rack boxes 10.0.1.1,10.0.2.1" in said, said
    assert (tmp_path / "c.png").stat().st_size > 0


EPOCHS_KILLED = 24


@pytest.mark.parametrize("box, names", [
    (1, ("10.0.1.1", "the rack box 10.0.0.2")),     # rack 0's box: its port, or its uplink
    (0, ("10.0.0.1",)),                             # the parent
], ids=["rack box r0 killed", "parent powered off"])
def test_a_box_of_the_tree_lost_mid_run_sends_every_rank_to_gloo_within_2s(tmp_path, box, names):
    # Killed 1 s in: after the first epoch (0.1-0.36 s on a loaded machine;
    # at 0.3 s the kill raced it and once came first), well before the last
    # (8 epochs took 0.76 s once the udp datapath ran on the C engine: the
    # kill came after them; the epochs after the kill go through Gloo).
    res, said = _train(tmp_path, epochs=EPOCHS_KILLED, batch=16, kill=(box, 1.0))
    swml, lost = res["swml"], res["swml"]["lost_box"]
    ends = swml["epoch_end_t"]
    assert lost["killed"] and ends[0] < lost["killed_at"] < ends[-1], said
    for rank, after in lost["warned_after_s"].items():
        assert after is not None and after <= NOTICED_S, (rank, said)
    warned = [w for w in lost["warnings"] if "lost at swml call" in w["message"]]
    assert sorted(w["rank"] for w in warned) == [0, 1, 2, 3], said    # once each
    for w in warned:
        assert "go through gloo (no box left)" in w["message"], w
        assert any(name in w["message"] for name in names), w
    assert swml["every_box_lost"] and swml["epoch"][-1] == EPOCHS_KILLED, said
    assert swml["param_spread"] == 0.0
    assert abs(swml["test_acc"][-1] - res["gloo"]["test_acc"][-1]) <= 1.0, said
    assert "switch until every box was lost, then Gloo" in said, said
