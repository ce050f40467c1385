"""A lab of racks (needs root; switchml_xdp/lab/racks.py): racks of workers
behind uplinks to a core with the parent box, as a tree of boxes or flat.
The topology builds and goes without a trace; the uplinks' shapers hold
each way, on every path a frame takes (the stack's, and past the uplink's
qdisc as the rack box's XDP program sends); flat, every worker a member of
the parent's job across the core, reduces exactly. The tree (rack boxes
started with --uplink/--parent) reduces exactly (even and uneven racks, with
loss on every cable), and the workers of a rack join only their rack box."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from crafted_packets import qdisc_bypass_socket
from frames import endpoint, udp_frame
from lab_jobs import run_job, skip_without_afxdp
from switchml_xdp.lab import netns
from switchml_xdp.lab.cluster import SwitchProcess, run_ranks
from switchml_xdp.lab.racks import RacksLab, switches_of_the_racks

SIZE = 40_000          # elements: 157 packets a rank at k=256
UPLINK_MBIT = 20.0     # slow enough to measure from Python
FLOOD_PORT = 47100
FRAME_PAYLOAD = 1000


# -- the topology ----------------------------------------------------------------

@pytest.mark.parametrize("layout", ["tree", "flat"])
def test_the_topology_builds_and_goes_without_a_trace(layout):
    lab = RacksLab(2, "1,2", layout)
    with lab:
        assert all(netns.ns_path(ns).exists() for ns in lab.namespaces)
        w0, w2 = lab.workers[0], lab.workers[2]
        assert [lab.rack_of(w) for w in lab.workers] == [0, 1, 1]
        for src, dst in ((w0, lab.box_of(w0).ip), (w0, w2.ip), (w2, lab.switch.ip)):
            assert lab.run(src, ["ping", "-c1", "-W2", dst], check=False).returncode == 0, \
                f"{src.name} -> {dst}"
        addrs = lab.run(lab.rack_ports[0], ["ip", "-4", "-o", "addr", "show"]).stdout
        if layout == "tree":   # the rack box: a router between its rack and the core
            assert lab.rack_ports[0].ip in addrs and lab.uplinks[0].ip in addrs, addrs
            assert w0.ip.startswith("10.0.1.") and w2.ip.startswith("10.0.2."), lab.workers
        else:                  # a plain L2 path: no address, workers on the core's subnet
            assert "10.0." not in addrs, addrs
            assert {w.ip.rsplit(".", 1)[0] for w in lab.workers} == {"10.0.0"}
    assert not [ns for ns in netns.list_netns() if ns.startswith(f"{lab.prefix}-")]


def test_bad_racks_are_one_line_errors():
    from switchml_xdp.lab import LabError

    for args, said in (((2, "2,3,4"), "2 racks need"), ((0, 2), "racks must be"),
                       ((2, "2,x"), "per-rack must be"), ((2, 0), "whole number")):
        with pytest.raises(LabError, match=said):
            RacksLab(*args)
    with pytest.raises(LabError, match="layout"):
        RacksLab(2, 2, "star")


# -- the uplinks' shapers -------------------------------------------------------------

def _rx_bytes(lab, host) -> int:
    out = lab.run(host, ["ip", "-s", "-j", "link", "show", "dev", host.iface]).stdout
    return json.loads(out)[0]["stats64"]["rx"]["bytes"]


def _received_mbit(lab, receiver, send_one, seconds: float = 1.6) -> float:
    """What arrives at `receiver`'s interface, in Mbit/s, while `send_one()`
    sends a frame of about 1 KiB at three times UPLINK_MBIT; the first 0.4 s
    (the shaper's burst) left out."""
    stop = threading.Event()
    gap = (FRAME_PAYLOAD + 42) * 8 / (3 * UPLINK_MBIT * 1e6)

    def flood():
        next_at = time.monotonic()
        while not stop.is_set():
            for _ in range(10):
                try:
                    send_one()
                except OSError:   # a full qdisc (ENOBUFS): what a shaper does
                    pass
            next_at += 10 * gap
            time.sleep(max(0.0, next_at - time.monotonic()))

    sender = threading.Thread(target=flood)
    sender.start()
    try:
        time.sleep(0.4)
        before, t0 = _rx_bytes(lab, receiver), time.monotonic()
        time.sleep(seconds - 0.4)
        after, t1 = _rx_bytes(lab, receiver), time.monotonic()
    finally:
        stop.set()
        sender.join()
    return (after - before) * 8 / (t1 - t0) / 1e6


def _udp_sender(lab, src, dst_ip: str):
    with lab.enter(src):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = b"x" * FRAME_PAYLOAD
    return s, lambda: s.sendto(payload, (dst_ip, FLOOD_PORT))


def _bypass_sender(lab, src, dst):
    """Frames past `src`'s qdisc, as an XDP program's redirect or AF_XDP sends them."""
    s = qdisc_bypass_socket(lab, src)
    frame = udp_frame(endpoint(src, FLOOD_PORT), endpoint(dst, FLOOD_PORT), b"x" * FRAME_PAYLOAD)
    return s, lambda: s.send(frame)


def _within_the_rate(mbit: float, what: str) -> None:
    assert 0.75 * UPLINK_MBIT < mbit < 1.15 * UPLINK_MBIT, f"{what}: {mbit:.1f} Mbit/s"


def test_the_tree_uplinks_are_shaped_both_ways_past_the_qdisc_too():
    with RacksLab(2, 1, "tree", uplink_rate_mbit=UPLINK_MBIT) as lab:
        up0 = lab.uplinks[0]
        s, send = _udp_sender(lab, lab.switch, up0.ip)        # parent -> rack 0, down
        with s:
            _within_the_rate(_received_mbit(lab, up0, send), "down the uplink")
        s, send = _bypass_sender(lab, up0, lab.switch)         # rack box -> parent, up, XDP's path
        with s:
            _within_the_rate(_received_mbit(lab, lab.switch, send), "up the uplink past its qdisc")
        s, send = _udp_sender(lab, up0, lab.switch.ip)         # the same through the stack
        with s:
            _within_the_rate(_received_mbit(lab, lab.switch, send), "up the uplink, the stack")


def test_the_flat_uplinks_carry_a_whole_rack_at_their_rate():
    with RacksLab(2, 2, "flat", uplink_rate_mbit=UPLINK_MBIT) as lab:
        s, send = _udp_sender(lab, lab.workers[0], lab.switch.ip)
        with s:
            _within_the_rate(_received_mbit(lab, lab.switch, send), "a worker up across the core")
        s, send = _udp_sender(lab, lab.switch, lab.workers[3].ip)
        with s:
            _within_the_rate(_received_mbit(lab, lab.workers[3], send), "down to a worker")


# -- jobs ----------------------------------------------------------------------------

def _data(world: int) -> list[np.ndarray]:
    return [np.arange(SIZE, dtype=np.float32) % 97 * (r + 1) for r in range(world)]


def test_flat_every_worker_joins_the_parent_across_the_core_and_reduces_exactly():
    backends = ["udp", "afxdp", "udp", "afxdp"]
    skip_without_afxdp(backends)
    data = _data(4)
    with RacksLab(2, 2, "flat", rate_mbit=200, uplink_rate_mbit=200, loss="1%") as lab, \
            SwitchProcess(lab):
        results = run_job(lab, "flat", backends, lambda rank, w: w.allreduce(data[rank].copy()))
        counters = lab.loss_counters(lab.uplinks)
    for r in results:
        np.testing.assert_array_equal(r, sum(data))
    assert all(counters[u.name]["up"]["seen"] >= 2 * 157 for u in lab.uplinks), counters
    assert sum(counters[u.name]["up"]["dropped"] for u in lab.uplinks) > 0, counters


def _status(lab, box) -> dict:
    out = lab.run(box, [sys.executable, "-m", "switchml_xdp.cli.switch", "status", "--json",
                        "-i", "0"]).stdout
    [st] = [s for s in json.loads(out)["switches"] if s["iface"] == box.iface]
    return st


def _tree_job(lab, job: str, backend: str = "udp", while_up=None) -> None:
    """An allreduce through the tree, each rank joined to its rack's box,
    exact; while_up(), if given, is called once every rank has its result,
    before any leaves."""
    from switchml_xdp import Worker

    world, data = len(lab.workers), _data(len(lab.workers))
    all_done = threading.Barrier(world, timeout=60)

    def body(rank, host):
        with Worker(lab.box_of(host).ip, job, rank, world, backend=backend, verbose=False,
                    stall_timeout=30) as w:
            result = w.allreduce(data[rank].copy())
            if while_up is not None:
                all_done.wait()
                if rank == 0:
                    while_up()
                all_done.wait()
            return result

    for r in run_ranks(lab, lab.workers, body, timeout=120):
        np.testing.assert_array_equal(r, sum(data))


@pytest.mark.parametrize("per_rack, loss", [("2,2", None), ("2,3", None), ("2,2", "1%")],
                         ids=["2x2", "uneven-2,3", "2x2-loss-1%"])
def test_the_tree_reduces_exactly(per_rack, loss):
    import contextlib

    with RacksLab(None, per_rack, "tree", loss=loss) as lab, contextlib.ExitStack() as stack:
        switches_of_the_racks(stack, lab)
        _tree_job(lab, f"tree-{per_rack.replace(',', '-')}")
        if loss:
            counters = lab.loss_counters(lab.uplinks)
            assert sum(c[d]["dropped"] for c in counters.values() for d in ("up", "down")) > 0


def test_the_workers_of_a_rack_join_only_their_rack_box():
    """While the job is up, the parent's members are the rack boxes (from
    their uplinks' addresses), one stream a rack; each rack box's, its own
    rack's workers."""
    import contextlib

    seen = {}

    def statuses():
        seen["parent"] = _status(lab, lab.switch)
        seen["racks"] = [_status(lab, p) for p in lab.rack_ports]

    with RacksLab(2, 2, "tree") as lab, contextlib.ExitStack() as stack:
        switches_of_the_racks(stack, lab)
        _tree_job(lab, "only-their-box", while_up=statuses)
    [job] = seen["parent"]["jobs"]
    assert {m["ip"] for m in job["members"].values()} == {u.ip for u in lab.uplinks}, job
    assert sorted(c["ranks"] for c in job["children"]) == [[0, 1], [2, 3]], job
    [stats] = seen["parent"]["job_stats"].values()
    # One stream a rack (4 workers sending here would make it 4x): 2 packets
    # a round, and now and then a rack box's resend of a partial the parent
    # held while the other rack's was late (SWML_UP_HOLD_NS, a loaded machine).
    assert 0 < 2 * stats["results"] <= stats["packets"] <= 2.05 * stats["results"] + 4, stats
    for r, st in enumerate(seen["racks"]):
        [job] = st["jobs"]
        assert {m["ip"] for m in job["members"].values()} == {w.ip for w in lab.racks[r]}, job
        assert st["tree"]["parent"] == lab.switch.ip and st["tree"]["ip"] == lab.uplinks[r].ip


def test_a_racks_lab_is_found_again_by_its_prefix():
    from switchml_xdp.lab.racks import open_lab

    with RacksLab(2, "1,2", "tree", keep=True) as lab:
        try:
            again = open_lab(lab.prefix)
            assert isinstance(again, RacksLab) and again.rack_sizes == [1, 2]
            assert again.host("u1").ip == lab.uplinks[1].ip
            assert again.box_of("w2") == lab.rack_ports[1]
        finally:
            lab.close()
    assert subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout.count(lab.prefix) == 0


def test_a_killed_rack_box_leaves_nothing_once_its_lab_is_gone():
    """A rack box's daemon killed leaves its pins and state (to be adopted
    on restart); removing the lab removes them, as a box's."""
    from pathlib import Path

    from switchml_xdp import bpf

    with RacksLab(1, 1, "tree") as lab:
        rack_box = SwitchProcess(lab, lab.rack_box_args(0), box=1)
        rack_box.proc.kill()
        rack_box.proc.wait()
        pins = Path(bpf.pin_dir(lab.rack_ports[0].iface))
        assert pins.exists()
    assert not pins.exists()
    assert not list(Path("/run/swml").glob(f"{lab.rack_ports[0].iface}.*"))


def test_the_racks_bench_prints_one_rack_tree_and_flat_with_their_ratios(tmp_path):
    from switchml_xdp.bench.racks_bench import RacksConfig, _torch_missing, run_racks_bench

    lines = []
    cfg = RacksConfig([1, 2], rate_mbit=200, uplink_rate_mbit=100, size=256 << 10, iterations=1,
                      json_path=str(tmp_path / "rows.json"))
    doc = run_racks_bench(cfg, out=lines.append)
    gloo = [] if _torch_missing() else ["gloo ring, racks 1,2"]
    assert [r["row"] for r in doc["rows"]] == ["one rack of 2 alone", "tree, racks 1,2",
                                               "flat, racks 1,2", *gloo]
    assert all(r["tat_s"] > 0 and r["rel_err"] < 1e-6 for r in doc["rows"]), doc["rows"]
    assert "tree/one rack" in lines[2] and "flat/tree" in lines[3], lines
    assert not gloo or "gloo/tree" in lines[4], lines
    assert json.loads((tmp_path / "rows.json").read_text())["rows"] == doc["rows"]
