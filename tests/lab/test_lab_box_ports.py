"""A box with several ports (needs root): `swml-switch up PORT PORT ...` in a
lab whose switch has a port on each segment of workers (Lab(ports=P)). One
job's members behind different ports reduce exactly, through multicast
(devmap broadcast) and unicast fan-out, over udp and AF_XDP; each port
counts its own frames; `down` takes the program off every port; a bad port
list is one clear error."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from lab_jobs import run_job, skip_without_afxdp
from switchml_xdp import bpf
from switchml_xdp.lab import Lab
from switchml_xdp.lab.cluster import SwitchProcess

SIZE = 40_000   # elements: 157 packets a rank at k=256


def _status(lab) -> dict:
    out = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "status",
                               "--json", "-i", "0"]).stdout
    [st] = [s for s in json.loads(out)["switches"] if s["iface"] == lab.switch.iface]
    return st


def _reduce_exactly(lab, job: str, backends) -> None:
    world = len(backends)
    data = [np.arange(SIZE, dtype=np.float32) % 97 * (r + 1) for r in range(world)]
    want = sum(data)
    results = run_job(lab, job, backends, lambda rank, w: w.allreduce(data[rank].copy()))
    for r in results:
        np.testing.assert_array_equal(r, want)


@pytest.mark.parametrize("fanout", ["multicast", "unicast"])
def test_members_behind_different_ports_reduce_exactly_and_each_port_counts_its_own(fanout):
    backends = ["udp", "afxdp", "udp", "afxdp"]
    skip_without_afxdp(backends)
    with Lab(workers=4, ports=2, multicast=fanout == "multicast") as lab, \
            SwitchProcess(lab, ["--fanout", fanout]):
        _reduce_exactly(lab, f"ports-{fanout}", backends)
        st = _status(lab)
    assert st["ports"] == [lab.switch.iface, lab.box_ports[0].iface]
    c, (p0, p1) = st["counters"], st["port_stats"]
    # Workers 0, 2 sit on segment 0, 1 and 3 on segment 1: the same share each.
    assert p0["rx_packets"] + p1["rx_packets"] == c["rx"]
    assert p0["rx_packets"] >= 2 * 157 and p1["rx_packets"] >= 2 * 157, st["port_stats"]
    assert p0["rx_bytes"] > 0 and p1["rx_bytes"] > 0
    if fanout == "multicast":   # a RESULT out of every port
        assert p0["tx_packets"] >= c["completed"] and p1["tx_packets"] >= c["completed"] > 0
    else:                       # a copy to each member, out of its own port
        assert c["unicast_copies"] >= 4 * c["completed"] > 0, c
        assert p0["tx_packets"] >= 2 * c["completed"] and p1["tx_packets"] >= 2 * c["completed"]
        assert c["unicast_clone_failed"] == c["unicast_no_mac"] == 0, c


def test_a_job_behind_one_port_sends_no_result_out_of_the_others():
    """Its multicast RESULTs leave only the ports its members came in on
    (the job's learnt port mask, swml_port_filter)."""
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    with Lab(workers=4, ports=2) as lab, SwitchProcess(lab):
        hosts = [lab.workers[0], lab.workers[2]]   # both on segment 0

        def body(rank, host):
            with Worker(lab.switch.ip, "one-port", rank, 2, backend="udp", verbose=False) as w:
                return w.allreduce(np.ones(SIZE, np.float32))

        for r in run_ranks(lab, hosts, body):
            np.testing.assert_array_equal(r, 2)
        st = _status(lab)
    c, (p0, p1) = st["counters"], st["port_stats"]
    assert p0["tx_packets"] >= c["completed"] > 0 and p1["rx_packets"] == 0, st["port_stats"]
    assert p1["tx_packets"] == 0, st["port_stats"]


def test_down_takes_the_program_off_every_port_and_a_bad_port_list_is_one_error():
    with Lab(workers=2, ports=3) as lab:
        ports = [lab.switch.iface] + [p.iface for p in lab.box_ports]
        sw = SwitchProcess(lab)
        assert sum(bpf.attachment(p, netns=lab.switch.ns).prog_id > 0 for p in ports) == 3
        _reduce_exactly(lab, "ports-down", ["udp", "udp"])
        r = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "down",
                                 lab.switch.iface], check=False)
        assert r.returncode == 0, r.stderr
        sw.proc.wait(timeout=20)
        assert all(bpf.attachment(p, netns=lab.switch.ns).prog_id == 0 for p in ports)
        # A port twice, and a port outside the box's bridge: one line each, nothing loaded.
        for argv, why in [([ports[0], ports[1], ports[1]], "given twice"),
                          ([ports[0], "lo"], "members of one bridge")]:
            r = lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", "up",
                                     *argv], check=False)
            assert r.returncode == 1 and why in r.stderr and "Traceback" not in r.stderr, r.stderr
            assert all(bpf.attachment(p, netns=lab.switch.ns).prog_id == 0 for p in ports)


def test_ports_of_different_rates_shape_each_its_own_link():
    with Lab(workers=2, ports=2, box_rate_mbit=[50, 100]) as lab:
        rates = []
        for port in [lab.switch, lab.box_ports[0]]:
            out = subprocess.run(["tc", "-n", lab.bridge_ns, "qdisc", "show", "dev", port.peer],
                                 capture_output=True, text=True, check=True).stdout
            rates.append(out)
        assert "50Mbit" in rates[0] and "100Mbit" in rates[1], rates


def test_a_switch_of_one_port_keeps_its_address_on_its_link():
    with Lab(workers=1) as lab:
        out = lab.run(lab.switch, ["ip", "-o", "-4", "addr", "show"]).stdout
    [line] = [ln for ln in out.splitlines() if f" {lab.switch.ip}/" in ln]
    assert line.split()[1] == lab.switch.iface and f"{lab.prefix}-sb" not in out, out


def test_swml_lab_demo_runs_its_job_through_a_switch_of_two_ports():
    from click.testing import CliRunner

    from switchml_xdp.cli import lab as lab_cli

    r = CliRunner().invoke(lab_cli.main, [
        "demo", "-n", "2", "--ports", "2", "--box-rate", "200", "--size", "1MiB",
        "--iterations", "2", "--warmup", "1"])
    assert r.exit_code == 0, r.output
    assert "switch 10.0.0.1 + 2 workers on 2 segments, one a port of the switch" in r.output
    assert r.output.count(" ok") >= 2, r.output   # every result checked, both ranks
