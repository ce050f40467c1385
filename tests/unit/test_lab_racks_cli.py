"""A lab of racks before anything is built (switchml_xdp/lab/racks.py): its
hosts and addresses, each layout's, the racks' sizes, the bench's bounds,
and `swml-lab up/demo/bench/train --racks` refusing what does not go with
it in one line. The lab itself: tests/lab/test_lab_racks.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.lab import LabError
from switchml_xdp.lab.racks import RacksLab, rack_sizes


def test_rack_sizes_take_one_count_or_one_a_rack():
    assert rack_sizes(2, 4) == rack_sizes(2, "4") == [4, 4]
    assert rack_sizes(None, "2,3,4") == rack_sizes(3, [2, 3, 4]) == [2, 3, 4]
    for args, says in (((2, "2,3,4"), "2 racks need"), ((8, 1), "racks must be 1..7"),
                       ((2, "2,,3"), "per-rack must be"), ((2, -1), "whole number"),
                       ((1, 300), "at most")):
        with pytest.raises(LabError, match=says):
            rack_sizes(*args)


def test_the_tree_puts_each_rack_on_its_own_subnet_behind_its_box():
    lab = RacksLab(2, "1,2", "tree", prefix="t")
    assert [h.name for h in lab.hosts] == ["sw", "r0", "r1", "u0", "u1", "w0", "w1", "w2"]
    assert [w.ip for w in lab.workers] == ["10.0.1.11", "10.0.2.11", "10.0.2.12"]
    assert [lab.box_of(w).ip for w in lab.workers] == ["10.0.1.1", "10.0.2.1", "10.0.2.1"]
    assert [u.ip for u in lab.uplinks] == ["10.0.0.2", "10.0.0.3"]
    assert lab.switches == [lab.switch, *lab.rack_ports]   # SwitchProcess(lab, box=1 + r)
    assert lab.rack_box_args(1) == ["--uplink", "t-u1", "--parent", "10.0.0.1"]
    assert lab.namespaces == ["t-br", "t-sw", "t-r0", "t-r1", "t-w0", "t-w1", "t-w2"]
    assert lab.cable_links == [*lab.workers, *lab.uplinks]
    peers = [h.peer for h in lab.hosts]
    assert len(set(peers)) == len(peers) and len({h.mac for h in lab.hosts}) == len(lab.hosts)
    assert lab.describe()["racks"] == {"per_rack": [1, 2], "layout": "tree",
                                       "uplink_rate_mbit": None}


def test_flat_racks_are_one_subnet_on_the_parent():
    lab = RacksLab(2, 2, "flat", prefix="f")
    assert [w.ip for w in lab.workers] == [f"10.0.0.{11 + i}" for i in range(4)]
    assert {lab.box_of(w) for w in lab.workers} == {lab.switch}
    assert lab.switches == [lab.switch]


def test_bench_bounds_one_rack_tree_and_flat():
    from switchml_xdp.bench.constants import boxes_bound_s, gloo_bound_mbps
    from switchml_xdp.bench.racks_bench import K, RacksConfig, bounds_s

    b = bounds_s(RacksConfig([2, 3, 4], rate_mbit=100, uplink_rate_mbit=100, size=1 << 20))
    one = boxes_bound_s(1 << 20, 1, 100, [], K)
    assert b["one rack"] == pytest.approx(one) and b["tree"] == pytest.approx(one)
    assert b["flat"] == pytest.approx(4 * one)             # the rack of 4 on its uplink
    slow = bounds_s(RacksConfig([4, 4], rate_mbit=100, uplink_rate_mbit=50, size=1 << 20))
    assert slow["tree"] == pytest.approx(2 * one) and slow["flat"] == pytest.approx(8 * one)
    # Gloo's ring: 2(N-1)/N of the tensor over its slowest link, in TCP frames.
    assert slow["gloo"] == pytest.approx(
        (1 << 20) * 8 / (gloo_bound_mbps(50, 8) * 1e6)) and slow["gloo"] > slow["tree"]


@pytest.mark.parametrize("args, says", [
    (["demo", "--per-rack", "2"], "only with --racks"),
    (["demo", "--uplink-rate", "100"], "only with --racks"),
    (["demo", "--layout", "flat"], "only with --racks"),
    (["demo", "--racks", "2", "--per-rack", "2,3,4"], "2 racks need"),
    (["demo", "--racks", "2", "-n", "4"], "not with --racks"),
    (["demo", "--racks", "2", "--boxes", "2"], "not with --racks"),
    (["demo", "--racks", "2", "--fanout", "unicast"], "not with --racks"),
    (["demo", "--racks", "8"], "--racks"),
    (["up", "--racks", "2", "--snooping"], "not with --racks"),
    (["up", "--racks", "2", "--switch", "--switch-args", "-k 999"], "--elements"),
    (["bench", "--per-rack", "2"], "only with --racks"),
    (["bench", "--racks", "2", "-k", "64"], "not with --racks"),
    (["bench", "--racks", "2", "--systems", "gloo"], "not with --racks"),
    (["bench", "--racks", "2", "--size", "1Q"], "not a size"),
    (["train", "--per-rack", "2"], "only with --racks"),
    (["train", "--racks", "2", "-n", "4"], "not with --racks"),
    (["train", "--racks", "2", "--boxes", "2"], "not with --racks"),
    (["train", "--racks", "2", "--per-rack", "1,2,3"], "2 racks need"),
    (["train", "--racks", "2", "--kill-box", "r2", "--kill-after", "1"], "r0..r1"),
    (["train", "--racks", "2", "--kill-box", "1", "--kill-after", "1"], "parent or r0..r1"),
    (["train", "--racks", "2", "--layout", "flat", "--kill-box", "r0", "--kill-after", "1"],
     "parent only"),
    (["train", "--racks", "2", "--kill-box", "parent"], "go together"),
    (["train", "--kill-box", "r0", "--kill-after", "1"], "boxes 0..0"),
])
def test_bad_racks_arguments_fail_before_anything_is_built(args, says):
    said = CliRunner().invoke(lab_cli.main, args)
    # a usage error (2), in one line that says why, never a traceback
    assert (said.exit_code, says in said.output, "Traceback" in said.output) == (2, True, False), \
        said.output


def test_train_racks_reach_the_run_each_box_to_kill_by_its_name(monkeypatch):
    pytest.importorskip("sklearn", reason="swml-lab train needs scikit-learn")
    pytest.importorskip("matplotlib", reason="swml-lab train needs matplotlib")
    pytest.importorskip("torch", reason="swml-lab train needs torch")
    from switchml_xdp.lab import train_runs

    seen = {}
    monkeypatch.setattr(train_runs, "run_lab_training",
                        lambda workers, cfg, *a, **kw: seen.update(cfg=cfg, **kw))
    for box, index in (("r1", 2), ("parent", 0), ("R0", 1)):
        r = CliRunner().invoke(lab_cli.main, ["train", "--racks", "2", "--per-rack", "2,3",
                                              "--uplink-rate", "100", "--kill-box", box,
                                              "--kill-after", "2"])
        assert r.exit_code == 0, r.output
        assert (seen["cfg"].racks, seen["cfg"].layout, seen["uplink_rate"], seen["kill"]) == \
            ([2, 3], "tree", 100, (index, 2)), seen
    r = CliRunner().invoke(lab_cli.main, ["train", "--racks", "3", "--layout", "flat"])
    assert r.exit_code == 0 and seen["cfg"].racks == [2, 2, 2] and seen["kill"] is None, r.output
    assert seen["cfg"].layout == "flat"


def test_bench_racks_runs_the_racks_rows_loss_free_unless_told(monkeypatch, tmp_path):
    from switchml_xdp.bench import racks_bench

    seen: list[racks_bench.RacksConfig] = []
    monkeypatch.setattr(racks_bench, "run_racks_bench", lambda cfg, out: seen.append(cfg))
    out = ["--out", str(tmp_path)]
    r = CliRunner().invoke(lab_cli.main, ["bench", "--racks", "2", "--per-rack", "4",
                                          "--uplink-rate", "100", *out])
    assert r.exit_code == 0, r.output
    cfg = seen[-1]
    assert (cfg.per_rack, cfg.rate_mbit, cfg.uplink_rate_mbit, cfg.losses) == \
        ([4, 4], 100.0, 100.0, (0.0,))
    assert cfg.json_path == str(tmp_path / "racks_bench.json")
    r = CliRunner().invoke(lab_cli.main, ["bench", "--racks", "2", "--loss", "0,1%",
                                          "--rate", "50", *out])
    assert r.exit_code == 0, r.output
    assert seen[-1].losses == (0.0, 0.01) and seen[-1].rate_mbit == 50.0
    assert seen[-1].queue is None
    r = CliRunner().invoke(lab_cli.main, ["bench", "--racks", "2", "--queue", "32", *out])
    assert r.exit_code == 0, r.output
    assert seen[-1].queue == 32       # shallow buffers: every shaped queue 32 packets
