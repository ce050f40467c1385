"""The tree's control path with real daemons (needs root): a parent box and
two rack boxes (`swml-switch up --uplink --parent`) in a racks lab, one
worker a rack, each joining only its rack box. The join replies, `status`
on both levels, and the parent lost (stopped or killed): every rack's
worker is told within 2 s, with a reason naming the parent. The same path
in one process, without root: tests/unit/test_tree_control.py."""
from __future__ import annotations

import contextlib
import json
import sys
import time

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from control_helpers import Raw, join_msg
from switchml_xdp.lab.racks import RacksLab, switches_of_the_racks

ABORT_WITHIN_S = 2.0


def _status(lab, box) -> dict:
    out = lab.run(box, [sys.executable, "-m", "switchml_xdp.cli.switch", "status", "--json",
                        "-i", "0"]).stdout
    [st] = [s for s in json.loads(out)["switches"] if s["iface"] == box.iface]
    return st


def _join_both(lab, job: str) -> list[tuple[Raw, dict]]:
    """Rank r from rack r's worker to rack r's box; both replies."""
    conns = [Raw(lab, w, box_ip=lab.box_of(w).ip) for w in lab.workers]
    for rank, (c, w) in enumerate(zip(conns, lab.workers)):
        c.send(join_msg(job, 2, rank, w, token="tree-token", timeout=20))
    return [(c, c.recv(30)) for c in conns]


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_rack_workers_join_their_box_and_learn_of_the_parent_lost(how):
    with RacksLab(2, 1, "tree") as lab, contextlib.ExitStack() as stack:
        parent, *_ = switches_of_the_racks(stack, lab)
        (c0, r0), (c1, r1) = _join_both(lab, f"tree-ctl-{how}")
        assert r0["ok"] and r1["ok"], (r0, r1)
        assert (r0["world"], r0["rank"], r1["rank"]) == (2, 0, 1)
        assert r0["switch"]["ip"] == lab.rack_ports[0].ip and r0["slots"] == r1["slots"]

        rack = _status(lab, lab.rack_ports[0])
        assert rack["tree"]["parent"] == lab.switch.ip
        assert rack["tree"]["uplink"] == lab.uplinks[0].iface
        [(name, j)] = rack["tree"]["jobs"].items()
        assert name == f"tree-ctl-{how}" and j["rank"] == 0 and j["ranks"] == [0]
        top = _status(lab, lab.switch)
        [job] = [x for x in top["jobs"] if x["name"] == name]
        assert [c["box"].split(":")[0] for c in job["children"]] == [u.ip for u in lab.uplinks]
        assert job["id"] == j["parent_job"]

        t0 = time.monotonic()
        if how == "stopped":
            parent.proc.terminate()
            words = (f"the parent box {lab.switch.ip} aborted the job: the switch is shutting "
                     f"down")
        else:
            parent.proc.kill()
            words = f"lost the parent box {lab.switch.ip} (its control connection closed)"
        for c in (c0, c1):
            event = c.recv(ABORT_WITHIN_S + 1)
            assert event == {"event": "abort", "job": name, "reason": words}, event
        assert time.monotonic() - t0 < ABORT_WITHIN_S
        for c in (c0, c1):
            c.close()


def test_a_rack_box_killed_is_told_to_the_other_racks_naming_it():
    with RacksLab(2, 1, "tree") as lab, contextlib.ExitStack() as stack:
        _, rack0, _ = switches_of_the_racks(stack, lab)
        (c0, r0), (c1, r1) = _join_both(lab, "tree-ctl-rack-lost")
        assert r0["ok"] and r1["ok"], (r0, r1)
        t0 = time.monotonic()
        rack0.proc.kill()
        event = c1.recv(ABORT_WITHIN_S + 1)
        assert event["event"] == "abort" and event["reason"] == (
            f"the parent box {lab.switch.ip} aborted the job: the rack box {lab.uplinks[0].ip} "
            f"(rank 0 behind it) disconnected from the switch without leaving"), event
        assert time.monotonic() - t0 < ABORT_WITHIN_S
        assert c0.recv(ABORT_WITHIN_S) is None   # its own box is gone: the connection closed
        for c in (c0, c1):
            c.close()


@pytest.mark.parametrize("dark", ["rack box", "parent"])
def test_a_box_gone_dark_fails_the_job_on_every_rack_within_2_s(dark):
    """A box that goes dark (its links down: power, a cable) sends nothing,
    not even a FIN: the other end notices by its heartbeats (children.py,
    TREE_LEASE_S), and the job fails on every rank that can still hear,
    naming the box."""
    with RacksLab(2, 1, "tree") as lab, contextlib.ExitStack() as stack:
        switches_of_the_racks(stack, lab)
        (c0, r0), (c1, r1) = _join_both(lab, f"tree-dark-{dark.replace(' ', '-')}")
        assert r0["ok"] and r1["ok"], (r0, r1)
        t0 = time.monotonic()
        if dark == "parent":
            lab.run(lab.switch, ["ip", "link", "set", "dev", lab.switch.iface, "down"])
            hear = [(c0, 0), (c1, 1)]
        else:
            box = lab.rack_ports[0]
            for host in (box, lab.uplinks[0]):
                lab.run(host, ["ip", "link", "set", "dev", host.iface, "down"])
            hear = [(c1, 1)]
        for c, r in hear:
            event = c.recv(ABORT_WITHIN_S + 1)
            said = (f"lost the parent box {lab.switch.ip} (no answer to heartbeats for 1.5 s)"
                    if dark == "parent" else
                    f"the parent box {lab.switch.ip} aborted the job: the rack box "
                    f"{lab.uplinks[0].ip} (rank 0 behind it) stopped heartbeating (lease of 1.5 s "
                    f"expired)")
            assert event["event"] == "abort" and event["reason"] == said, (r, event)
            assert time.monotonic() - t0 < ABORT_WITHIN_S, r
        for c in (c0, c1):
            c.close()
