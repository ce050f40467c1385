"""A lab of several boxes (switch hosts) on paper: every name, address and MAC
is distinct from every other host's for any box and worker count, box 0 is
the switch it always was, and a bad box count is one clear error. The lab
itself: tests/lab/test_lab_boxes.py."""
from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.lab import Lab, LabError
from switchml_xdp.lab.addressing import (
    IFNAMSIZ,
    MAX_BOXES,
    box_host,
    box_index,
    is_namespace_of,
    peer_mac,
    switch_host,
)

PREFIX = "swlabcde"   # as long as a default prefix


def test_no_two_hosts_share_a_name_address_or_mac():
    for boxes in range(1, MAX_BOXES + 1):
        for workers in range(1, 65):
            lab = Lab(workers=workers, prefix=PREFIX, boxes=boxes)
            hosts = lab.hosts
            assert len(hosts) == boxes + workers
            for field in ("name", "ns", "iface", "ip", "mac", "peer"):
                values = [getattr(h, field) for h in hosts]
                assert len(set(values)) == len(values), (boxes, workers, field)
            peers = [peer_mac(h) for h in hosts]
            assert len(set(peers) | {h.mac for h in hosts}) == 2 * len(hosts)
            assert {h.iface for h in hosts}.isdisjoint({h.peer for h in hosts})
            assert all(is_namespace_of(PREFIX, ns) for ns in lab.namespaces)


def test_boxes_sit_below_every_worker_address():
    last_box = box_host(PREFIX, MAX_BOXES - 1)
    first_worker = Lab(workers=1, prefix=PREFIX).workers[0]
    assert int(last_box.ip.rsplit(".", 1)[1]) < int(first_worker.ip.rsplit(".", 1)[1])
    for b in range(MAX_BOXES):
        host = box_host(PREFIX, b)
        assert box_index(host) == b
        assert len(host.iface) <= IFNAMSIZ and len(host.peer) <= IFNAMSIZ
    assert box_index(first_worker) is None


def test_box_0_is_the_switch_as_before():
    lab = Lab(workers=2, prefix=PREFIX, boxes=3)
    assert lab.switch == lab.switches[0] == switch_host(PREFIX)
    assert dataclasses.astuple(lab.switch) == ("sw", f"{PREFIX}-sw", f"{PREFIX}-s", "10.0.0.1",
                                               "02:5d:00:00:00:01", f"{PREFIX}-bs")
    assert [b.name for b in lab.switches] == ["sw", "sw1", "sw2"]
    assert [b.ip for b in lab.switches] == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert lab.host("sw2") is lab.switches[2] and lab.host(f"{PREFIX}-sw1") is lab.switches[1]
    described = lab.describe()
    assert described["switch"]["ip"] == "10.0.0.1"
    assert [b["name"] for b in described["switches"]] == ["sw", "sw1", "sw2"]


@pytest.mark.parametrize("boxes", [0, -1, MAX_BOXES + 1, 2.0, "2", True, None])
def test_a_bad_box_count_is_one_clear_error(boxes):
    with pytest.raises(LabError, match=f"^boxes must be an integer from 1 to {MAX_BOXES}, not "):
        Lab(workers=2, prefix=PREFIX, boxes=boxes)


def test_a_bad_box_rate_is_one_clear_error():
    with pytest.raises(LabError, match=r"^box rate must be in \(0, "):
        Lab(workers=2, boxes=2, box_rate_mbit=0)
    # A box rate alone is a rate the queue can belong to.
    Lab(workers=2, boxes=2, box_rate_mbit=50, queue_packets=32)


@pytest.mark.parametrize("args, says", [
    (["up", "--boxes", "0"], "--boxes"),
    (["up", "--boxes", str(MAX_BOXES + 1)], "--boxes"),
    (["up", "--boxes", "2", "--box-rate", "0"], "--box-rate"),
    (["up", "--box-rate", "fast"], "--box-rate"),
])
def test_bad_box_options_fail_before_anything_is_built(args, says):
    r = CliRunner().invoke(lab_cli.main, args)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output, r.output
