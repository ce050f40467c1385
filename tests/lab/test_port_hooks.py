"""Lab(port_hooks="boxes"): the lab's XDP pass program sits on the boxes'
bridge ports alone (lab/wiring.py, PORT_HOOKS), and everything still gets
through: the switch's XDP_TX results, a worker's DATA sent through its UDP
socket and through its AF_XDP socket in copy mode, the udp backend, and a
TCP stream between two workers (Gloo's path), which crosses the bridge in
GSO skbs. `swml-lab bench --port-hooks boxes` measures on such a lab
(docs/performance.md, "The lab's port hooks"), `swml-lab up --port-hooks boxes`
leaves one up."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from clis import LAB_CLI
from lab_jobs import K, run_job, skip_without_afxdp, tcp_stream
from requires import NO_LAB

pytestmark = pytest.mark.skipif(bool(NO_LAB), reason=f"lab tests: {NO_LAB}")

TCP_PORT = 47011
TCP_BYTES = 8 << 20


@pytest.fixture(scope="module")
def lab():
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=2, port_hooks="boxes") as lab, SwitchProcess(lab):
        yield lab


def test_only_the_box_port_carries_the_hook(lab):
    from switchml_xdp import net

    assert net.link_xdp(lab.switch.peer, lab.bridge_ns)[1] != 0
    for host in lab.workers:
        assert net.link_xdp(host.peer, lab.bridge_ns) == (0, 0), host.name


@pytest.mark.parametrize("backend, udp_tx", [("afxdp", None), ("afxdp", "0"), ("udp", None)])
def test_every_send_path_reaches_the_box_and_back(lab, monkeypatch, backend, udp_tx):
    skip_without_afxdp([backend])
    if udp_tx is not None:
        monkeypatch.setenv("SWML_AFXDP_UDP_TX", udp_tx)
    n = 300 * K + 7

    def body(rank, w):
        x = np.arange(n, dtype=np.int32) * (rank + 1)
        w.allreduce(x)
        return x, w.stats()

    for x, stats in run_job(lab, f"hooks-{backend}-{udp_tx}", [backend] * 2, body):
        assert np.array_equal(x, np.arange(n, dtype=np.int32) * 3)
        if backend == "afxdp":
            assert stats["udp_tx"] == (0 if udp_tx == "0" else 1), stats


def test_a_tcp_stream_between_workers_gets_through(lab):
    """Gloo's path: a worker's TCP segments cross the hook-less bridge."""
    assert tcp_stream(lab, TCP_PORT, TCP_BYTES) == [TCP_BYTES, TCP_BYTES]


def test_swml_lab_up_builds_such_a_lab_and_a_handle_on_it_knows():
    """`swml-lab up --port-hooks boxes`: the lab it leaves up has hooks on the
    box's port alone, and Lab.from_state (swml-lab's other commands) says so."""
    from switchml_xdp import net
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.addressing import new_prefix

    prefix = new_prefix()
    r = subprocess.run(LAB_CLI + ["up", "-n", "2", "--prefix", prefix, "--port-hooks", "boxes"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lab = Lab.from_state(prefix)
    try:
        assert lab.port_hooks == "boxes"
        assert net.link_xdp(lab.switch.peer, lab.bridge_ns)[1] != 0
        assert all(net.link_xdp(h.peer, lab.bridge_ns) == (0, 0) for h in lab.workers)
    finally:
        lab.close()
