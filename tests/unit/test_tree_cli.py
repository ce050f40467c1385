"""A tree of boxes at the command line: `swml-switch up --uplink --parent`
refused in one line where it cannot be (one without the other, a bad
address, the userspace data plane, the uplink among the box's ports), and
`status` text showing a rack box's parent and a parent's rack boxes. The
control path itself: test_tree_control.py."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from switchml_xdp import wire
from switchml_xdp.cli import status_text
from switchml_xdp.cli import switch as switch_cli


@pytest.mark.parametrize("args, words", [
    (["--uplink", "eth2"], "a rack box needs both --uplink IFACE and --parent IP (or neither)"),
    (["--parent", "10.0.100.1"], "a rack box needs both --uplink IFACE and --parent IP"),
    (["--uplink", "eth2", "--parent", "10.0.100.300"], "is not an IPv4 address"),
    (["--uplink", "eth2", "--parent", "10.0.100.1", "--parent-control-port", "0"],
     "--parent-control-port"),
    (["--uplink", "eth2", "--parent", "10.0.100.1", "--dataplane", "userspace"],
     "a rack box (--uplink, --parent) needs the xdp data plane"),
    (["--uplink", "lo", "--parent", "10.0.100.1"], "the uplink lo is also a port of the box"),
])
def test_up_refuses_a_rack_box_it_cannot_be_in_one_line(args, words):
    r = CliRunner().invoke(switch_cli.main, ["up", "lo", *args])
    assert r.exit_code in (1, 2), r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error:") and words in last, r.output


def _switch(**extra) -> dict:
    return {"iface": "eth1", "pid": 42, "started": 1.0, "alive": True, "label": "native XDP",
            "params": {"k": 256, "slots": 1024, "port": wire.DEFAULT_PORT},
            "ip": "10.0.1.1", "control_port": wire.DEFAULT_CONTROL_PORT,
            "counters": dict.fromkeys(wire.COUNTER_NAMES, 0), **extra}


def test_status_shows_a_rack_boxs_parent_and_its_jobs_there():
    tree = {"uplink": "eth2", "ip": "10.0.100.11", "parent": "10.0.100.1",
            "parent_control_port": wire.DEFAULT_CONTROL_PORT,
            "jobs": {"train": {"parent_job": 3, "rank": 0, "ranks": [0, 2, 4, 6]}}}
    text = status_text.format_text(_switch(jobs=[], tree=tree))
    assert (f"  rack box below the parent 10.0.100.1:{wire.DEFAULT_CONTROL_PORT} through eth2 "
            f"(10.0.100.11)") in text
    assert "    job train: parent job 3, this box its rank 0 for ranks 0, 2, 4, 6" in text
    assert "rack box" not in status_text.format_text(_switch(jobs=[], tree=None))


def test_a_rack_box_s_counts_up_and_down_the_tree_show_on_rack_boxes_only():
    tree = {"uplink": "eth2", "ip": "10.0.100.11", "parent": "10.0.100.1",
            "parent_control_port": wire.DEFAULT_CONTROL_PORT, "jobs": {}}
    counts = {**dict.fromkeys(wire.COUNTER_NAMES, 0), "rx": 9, "sent_up": 3, "resent_up": 1,
              "up_held": 2, "from_parent": 3}
    rack = status_text.format_text(_switch(jobs=[], tree=tree, counters=counts), show_all=True)
    flat = status_text.format_text(_switch(jobs=[]), show_all=True)
    for name in status_text.TREE_OUTCOMES:
        assert name in rack and name not in flat, name


def test_status_shows_a_parents_rack_boxes():
    rack = {"ip": "10.0.100.11", "port": wire.DEFAULT_PORT, "mac": "02:00:00:00:00:0b",
            "left": False, "rack": f"10.0.100.11:{wire.DEFAULT_PORT}"}
    job = {"id": 3, "name": "train", "world": 3, "state": "running", "slot_base": 0, "slots": 128,
           "protected": True, "group": {"ip": "239.77.0.3", "mac": "01:00:5e:4d:00:03"},
           "members": {"0": rack, "1": {**rack, "ip": "10.0.100.20", "mac": "", "rack": None},
                       "2": rack},
           "children": [{"box": f"10.0.100.11:{wire.DEFAULT_PORT}", "rank": 0, "ranks": [0, 2]}]}
    del job["members"]["1"]["rack"]
    text = status_text.format_text(_switch(jobs=[job]))
    assert f"rank 2: 10.0.100.11:{wire.DEFAULT_PORT} 02:00:00:00:00:0b (behind the rack box)" in text
    assert "rank 1: 10.0.100.20" in text and "rank 1: 10.0.100.20:48864 (no MAC) (behind" not in text
    assert f"        rack box 10.0.100.11:{wire.DEFAULT_PORT}: rank 0 on the wire, for ranks 0, 2" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_rack_box_from_the_command_line_and_from_a_config_file(tmp_path, monkeypatch):
    from switchml_xdp.cli import switch_config

    seen = {}
    monkeypatch.setattr(switch_cli.daemon, "make_dataplane",
                        lambda *a, **kw: seen.update(uplink=a[6]) or object())
    monkeypatch.setattr(switch_cli.daemon, "run", lambda *a, **kw: seen.update(parent=kw["parent"]))
    monkeypatch.setattr(switch_config, "DEFAULT_CONFIG", "/nonexistent/swml/switch.toml")
    r = CliRunner().invoke(switch_cli.main, ["up", "eth1", "--uplink", "eth2", "--parent",
                                             "10.0.100.1", "--parent-control-port", "4000"])
    assert r.exit_code == 0 and seen == {"uplink": "eth2", "parent": ("10.0.100.1", 4000)}, r.output
    cfg = tmp_path / "switch.toml"
    cfg.write_text('iface = "eth1"\nuplink = "eth2"\nparent = "10.0.100.1"\n')
    r = CliRunner().invoke(switch_cli.main, ["up", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert seen == {"uplink": "eth2", "parent": ("10.0.100.1", wire.DEFAULT_CONTROL_PORT)}
    r = CliRunner().invoke(switch_cli.main, ["up", "eth1"])
    assert r.exit_code == 0 and seen["parent"] is None and seen["uplink"] is None
