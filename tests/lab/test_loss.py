"""The lab's loss and duplication injector (xdp/lab/swml_loss.c, switchml_xdp/lab/loss.py).

Real traffic between real namespaces: UDP datagrams from one worker to another
cross w0's link up (XDP and tc ingress on its bridge-side end) and w1's link
down (tc egress on w1's bridge-side end). Counters are compared as deltas, so
tests share one lab. The end-to-end test runs the real switch with lossy links.
"""
from __future__ import annotations

import math
import socket
import threading
import time

import numpy as np
import pytest

from frames import endpoint, udp_frame
from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from click.testing import CliRunner

from crafted_packets import qdisc_bypass_socket
from loss_flow import Flow
from switchml_xdp import wire
from switchml_xdp.cli.lab import main as lab_cli
from switchml_xdp.lab import Lab, LabError, cleanup_leftovers
from switchml_xdp.lab.addressing import new_prefix
from switchml_xdp.lab.cluster import run_ranks
from switchml_xdp.lab.lifecycle import lab_namespaces, state_path
from switchml_xdp.lab.loss import COUNTERS, LossInjector

PORT = wire.DEFAULT_PORT
OTHER_PORT = 5000
N = 2000
NO_BURSTS = {"bad": 0, "bursts": 0}


@pytest.fixture(scope="module")
def lab():
    with Lab(workers=2, loss=0.0) as lab:
        yield lab


@pytest.fixture(autouse=True)
def _no_loss(request):
    """Every test starts (and leaves the lab) with no loss, on the default port."""
    if "lab" in request.fixturenames:
        lab = request.getfixturevalue("lab")
        lab.set_loss(0, 0, hosts=lab.hosts, port=PORT)
        yield
        lab.set_loss(0, 0, hosts=lab.hosts, port=PORT)
    else:
        yield


# ------------------------------------------------------------------ helpers

def counters(lab) -> dict:
    return lab.loss_counters()


def delta(before: dict, after: dict) -> dict:
    return {h: {d: {k: after[h][d][k] - before[h][d][k] for k in COUNTERS} for d in after[h]}
            for h in after}


def within_binomial(k: int, n: int, p: float, sigmas: float = 5.0) -> bool:
    return abs(k - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def accounted(c: dict) -> bool:
    return c["seen"] == c["dropped"] + c["passed"]


# ------------------------------------------------------------------ loss

@pytest.mark.parametrize("p", [0.2, 0.5])
@pytest.mark.parametrize("direction", ["up", "down"])
def test_loss_is_binomial_and_every_frame_is_counted(lab, p, direction):
    """up: on the sender's link (XDP); down: on the receiver's link (tc egress)."""
    w0, w1 = lab.workers
    lossy = w0 if direction == "up" else w1
    lab.set_loss(p, hosts=[lossy], direction=direction)
    before = counters(lab)
    with Flow(lab, w0, w1) as flow:
        got = flow.send()
    d = delta(before, counters(lab))
    c = d[lossy.name][direction]
    assert c["seen"] == N, d
    assert accounted(c) and c["duplicated"] == 0, c
    assert within_binomial(c["dropped"], N, p), c
    assert got == c["passed"], (got, c)
    # The rest of the path saw exactly what the lossy hook let through, lost nothing.
    assert d["w0"]["up"]["seen"] == N and d["w1"]["down"]["seen"] == d["w0"]["up"]["passed"], d
    other = d["w1"]["down"] if direction == "up" else d["w0"]["up"]
    assert other["dropped"] == 0 and other["passed"] == other["seen"], d


def test_frames_that_bypass_the_qdisc_are_subject_too(lab):
    """AF_XDP in copy mode (all veth offers) transmits with __dev_direct_xmit,
    past the qdisc and tc egress of the worker's own interface; AF_PACKET with
    PACKET_QDISC_BYPASS takes the same path. Such frames still enter the
    bridge-side end through its XDP hook, so up loss applies to them."""
    w0, w1 = lab.workers
    lab.set_loss(0.5, hosts=[w0], direction="up")
    before = counters(lab)
    with Flow(lab, w0, w1) as flow:
        with qdisc_bypass_socket(lab, w0) as raw:
            frame = udp_frame(endpoint(w0, 40000), endpoint(w1, PORT), b"q" * 64)
            for i in range(N):
                raw.send(frame)
                if i % 100 == 99:
                    time.sleep(0.001)
        got = len(flow.drain())
    c = delta(before, counters(lab))["w0"]["up"]
    assert c["seen"] == N and accounted(c) and within_binomial(c["dropped"], N, 0.5), c
    assert got == c["passed"]


def test_down_loss_with_an_xdp_program_on_the_worker_interface(lab):
    """The AF_XDP backend attaches its redirect program to the worker's own
    interface; down loss sits on the bridge side and is unaffected by it."""
    from switchml_xdp import bpf

    w0, w1 = lab.workers
    with bpf.compile_program("lab/swml_pass.c", "swml_pass") as prog:
        bpf.attach(w1.iface, prog.fd, "native", netns=w1.ns)
        try:
            lab.set_loss(0.5, hosts=[w1], direction="down")
            before = counters(lab)
            with Flow(lab, w0, w1) as flow:
                got = flow.send()
            c = delta(before, counters(lab))["w1"]["down"]
            assert c["seen"] == N and accounted(c) and within_binomial(c["dropped"], N, 0.5), c
            assert got == c["passed"]
        finally:
            bpf.detach(w1.iface, netns=w1.ns)


def test_loss_zero_at_run_time_restores_full_delivery(lab):
    w0, w1 = lab.workers
    with Flow(lab, w0, w1) as flow:
        lab.set_loss("50%", direction="both")
        assert flow.send(500) < 400
        lab.set_loss(0)
        before = counters(lab)
        assert flow.send() == N
    d = delta(before, counters(lab))
    clean = {"seen": N, "dropped": 0, "duplicated": 0, "passed": N, **NO_BURSTS, "drop_runs": 0}
    assert d["w0"]["up"] == d["w1"]["down"] == clean


def test_only_the_data_port_is_subject_to_loss(lab):
    """With every data-port frame dropped both ways on both workers: ARP, ping,
    TCP and UDP on another port all pass, and none of them is counted."""
    w0, w1 = lab.workers
    lab.set_loss(1.0, direction="both")
    before = counters(lab)
    # ARP (neighbour caches flushed first) and ICMP.
    for w in (w0, w1):
        lab.run(w, ["ip", "neigh", "flush", "all"])
    lab.run(w0, ["ping", "-c", "2", "-i", "0.2", "-W", "2", w1.ip])
    # TCP: 1 MB through.
    with lab.enter(w1):
        srv = socket.create_server(("0.0.0.0", 7000))
    received = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            n = 0
            while chunk := conn.recv(65536):
                n += len(chunk)
            received.append(n)

    t = threading.Thread(target=serve)
    t.start()
    with lab.enter(w0):
        cli = socket.create_connection((w1.ip, 7000), timeout=5)
    with cli:
        cli.sendall(b"x" * (1 << 20))
    t.join(10)
    srv.close()
    assert received == [1 << 20]
    # UDP to and from another port: all through.
    with Flow(lab, w0, w1, dport=OTHER_PORT) as flow:
        assert flow.send() == N
    d = delta(before, counters(lab))
    assert all(c["seen"] == 0 for h in d.values() for c in h.values()), d
    # The data port, as destination or as source: all dropped, all counted.
    with Flow(lab, w0, w1, dport=PORT) as flow:
        assert flow.send() == 0
    with Flow(lab, w0, w1, dport=OTHER_PORT, sport=PORT) as flow:
        assert flow.send() == 0
    d = delta(before, counters(lab))
    assert d["w0"]["up"] == {"seen": 2 * N, "dropped": 2 * N, "duplicated": 0, "passed": 0,
                             **NO_BURSTS, "drop_runs": 1}, d
    assert d["w1"]["down"]["seen"] == 0


def test_port_zero_means_all_udp(lab):
    w0, w1 = lab.workers
    lab.set_loss(1.0, hosts=[w0], direction="up", port=0)
    before = counters(lab)
    with Flow(lab, w0, w1, dport=OTHER_PORT, sport=41000) as flow:
        assert flow.send() == 0
    lab.run(w0, ["ping", "-c", "1", "-W", "2", w1.ip])
    assert delta(before, counters(lab))["w0"]["up"]["dropped"] == N
    assert LossInjector.open(lab).port == 0


@pytest.mark.parametrize("direction", ["up", "down"])
def test_duplication_delivers_counted_extra_copies(lab, direction):
    """up: tc ingress clones into the bridge; down: tc egress clones towards
    the host. With loss too, passed frames are duplicated, dropped ones not."""
    w0, w1 = lab.workers
    lossy = w0 if direction == "up" else w1
    lab.set_loss(0.3, dup=0.5, hosts=[lossy], direction=direction)
    before = counters(lab)
    with Flow(lab, w0, w1) as flow:
        got = flow.send()
    c = delta(before, counters(lab))[lossy.name][direction]
    assert c["seen"] == N and accounted(c), c
    assert within_binomial(c["dropped"], N, 0.3), c
    assert within_binomial(c["duplicated"], c["passed"], 0.5), c
    assert got == c["passed"] + c["duplicated"], (got, c)


def test_settings_read_back_and_are_per_link_and_direction(lab):
    w0, w1 = lab.workers
    lab.set_loss("5%", dup=0.25, hosts=["w1"], direction="down")
    s = lab.loss_settings()
    assert s["w1"]["down"] == {"loss": pytest.approx(0.05), "dup": pytest.approx(0.25),
                               "burst": None}
    none = {"loss": 0.0, "dup": 0.0, "burst": None}
    assert s["w1"]["up"] == s["w0"]["up"] == s["w0"]["down"] == s["sw"]["up"] == s["sw"]["down"] == none
    lab.set_loss(1, hosts=[lab.switch])
    assert lab.loss_settings(["sw"])["sw"]["up"]["loss"] == 1.0
    for bad in ({"loss": 1.5}, {"loss": "-1%"}, {"loss": "lots"}, {"dup": 2},
                {"direction": "sideways"}, {"hosts": ["w9"]}, {"port": 70000},
                {"loss": 0.6, "burst": 1}, {"loss": 0.1, "burst": 0.5}):
        with pytest.raises(LabError):
            lab.set_loss(**bad)


def test_a_lab_without_loss_has_none_until_asked():
    with Lab(workers=1) as lab:
        assert lab.loss_counters() == {} and lab.loss_settings() == {}
        assert not LossInjector.exists(lab.prefix)
        lab.set_loss(0.5, hosts=[])          # attaches the injector, changes nothing
        assert lab.loss_settings()["w0"]["up"]["loss"] == 0.0
        assert LossInjector.exists(lab.prefix)
        prefix = lab.prefix
    assert not LossInjector.exists(prefix)


def test_cli_up_with_loss_then_from_state_then_down():
    prefix = new_prefix()
    runner = CliRunner()
    try:
        r = runner.invoke(lab_cli, ["up", "-n", "1", "--prefix", prefix, "--loss", "2%",
                                    "--dup", "0.005"])
        assert r.exit_code == 0, r.output
        assert "loss up/down" in r.output and "2%/2%" in r.output and "0.5%/0.5%" in r.output
        # Another handle (as another process would get) sets and reads the pinned maps.
        lab = Lab.from_state(prefix)
        lab.set_loss(1.0, hosts=["w0"], direction="up")
        assert lab.loss_settings()["w0"] == {"up": {"loss": 1.0, "dup": 0.0, "burst": None},
                                             "down": {"loss": 0.02, "dup": 0.005, "burst": None}}
        lab.run("w0", ["ping", "-c", "1", "-W", "2", lab.switch.ip])
        r = runner.invoke(lab_cli, ["up", "-n", "1", "--loss", "150%"])
        assert r.exit_code != 0 and "0..1" in r.output
        r = runner.invoke(lab_cli, ["down", prefix])
        assert r.exit_code == 0, r.output
        assert not lab_namespaces(prefix) and not state_path(prefix).exists()
        assert not LossInjector.exists(prefix)
    finally:
        cleanup_leftovers(prefix)


# ------------------------------------------------------------------ end to end

def wrap_sum(arrays) -> np.ndarray:
    return np.sum(np.stack(arrays).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


@pytest.mark.timeout(60)
def test_switch_reduces_exactly_through_lossy_links(lab8, switch):
    """4 udp workers, 5 % loss each way on their links: results stay exact,
    every worker retransmits, at least once per upstream packet it lost."""
    from switchml_xdp import Worker

    world, p = 4, 0.05
    hosts = lab8.workers[:world]
    k = wire.DEFAULT_K
    rng = np.random.default_rng(5)
    sizes = [100 * k + 1, 60 * k + 5, 50 * k]       # 213 packets a worker, each way
    calls = [[rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)
              for _ in range(world)] for n in sizes]

    def rank_body(rank, host):
        with Worker(lab8.switch.ip, "lossy-e2e", rank, world, backend="udp",
                    verbose=False) as w:
            outs = []
            for call in calls:
                a = call[rank].copy()
                w.allreduce(a)
                outs.append(a)
            return outs, w.stats()

    lab8.set_loss(p, hosts=hosts, direction="both")
    try:
        before = lab8.loss_counters()
        t0 = time.monotonic()
        results = run_ranks(lab8, hosts, rank_body, timeout=50)
        elapsed = time.monotonic() - t0
        d = delta(before, lab8.loss_counters())
    finally:
        lab8.set_loss(0, hosts=lab8.workers)
    for c, call in enumerate(calls):
        for rank in range(world):
            np.testing.assert_array_equal(results[rank][0][c], wrap_sum(call))
    up_passed = 0
    for rank, host in enumerate(hosts):
        stats = results[rank][1]
        up, down = d[host.name]["up"], d[host.name]["down"]
        assert accounted(up) and accounted(down), d[host.name]
        assert up["seen"] == stats["packets_sent"], (up, stats)   # every upstream packet
        assert up["dropped"] > 0 and down["dropped"] > 0, d[host.name]
        assert stats["retransmissions"] >= max(1, up["dropped"]), (stats, up)
        up_passed += up["passed"]
    # The switch's link (no loss) received exactly what the workers' links passed,
    # and its XDP_TX'd RESULTs went out through its bridge-side end.
    assert d["sw"]["down"]["seen"] == d["sw"]["down"]["passed"] == up_passed, d["sw"]
    assert d["sw"]["up"]["seen"] > 0 and d["sw"]["up"]["dropped"] == 0
    print(f"lossy reduce: {elapsed:.2f} s; "
          + "; ".join(f"{h.name} up {d[h.name]['up']['dropped']}/{d[h.name]['up']['seen']} "
                      f"down {d[h.name]['down']['dropped']}/{d[h.name]['down']['seen']} "
                      f"retx {results[r][1]['retransmissions']}" for r, h in enumerate(hosts)))
