"""Larger frames (docs/performance.md, "Larger frames"): a lab whose links
all have MTU 3494 (Lab(mtu=...)), the switch at k = SWML_MAX_K, a job on each
backend with exact sums in packets of 858 elements; a switch and a worker
refusing a k their link's MTU does not carry, in one line."""
from __future__ import annotations

import numpy as np
import pytest

from clis import SWITCH_CLI
from lab_jobs import run_job, skip_without_afxdp
from requires import NO_LAB
from switchml_xdp import net, wire


@pytest.fixture(scope="module")
def jumbo_lab():
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=2, mtu=wire.MAX_MTU) as lab, SwitchProcess(lab, ["-k", str(wire.MAX_K)]) as sw:
        yield lab, sw


def test_every_link_of_the_lab_has_the_mtu(jumbo_lab):
    lab, _ = jumbo_lab
    for host in lab.hosts:
        assert net.link_mtu(host.iface, host.ns) == wire.MAX_MTU
        assert net.link_mtu(host.peer, lab.bridge_ns) == wire.MAX_MTU
    assert net.link_mtu(lab.bridge, lab.bridge_ns) == wire.MAX_MTU


@pytest.mark.parametrize("backend", ["udp", "afxdp"])
def test_a_job_at_the_largest_k_sums_exactly(jumbo_lab, backend):
    lab, _ = jumbo_lab
    skip_without_afxdp([backend])
    n = 5 * wire.MAX_K + 17            # a short last packet too
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-2**29, 2**29, n, dtype=np.int32) for _ in range(2)]

    def body(rank, w):
        assert w.info.k == wire.MAX_K
        out = w.allreduce(inputs[rank].copy(), op="sum")
        big = w.allreduce(np.full(3 << 16, rank + 1, np.float32))
        return out, big, w.stats()["packets_sent"]

    results = run_job(lab, f"jumbo-{backend}", [backend] * 2, body)
    for out, big, sent in results:
        np.testing.assert_array_equal(out, inputs[0] + inputs[1])
        assert np.all(big == 3.0)
        # 858 elements a packet: the two calls' packets, not 360's.
        packets = -(-n // wire.MAX_K) + -(-(3 << 16) // wire.MAX_K)
        assert packets <= sent < 2 * packets


def test_a_worker_whose_link_is_too_small_fails_its_join_in_one_line(jumbo_lab):
    from switchml_xdp import Worker

    lab, _ = jumbo_lab
    w = lab.workers[1]
    lab.run(w, ["ip", "link", "set", "dev", w.iface, "mtu", "1500"])
    try:
        with lab.enter(w), pytest.raises(OSError) as e:
            Worker(lab.switch.ip, "jumbo-small", 0, 1, backend="udp", verbose=False)
        said = str(e.value)
        assert "\n" not in said
        assert (f"k={wire.MAX_K} needs an MTU of at least 3492 on {w.iface}, whose MTU is 1500 "
                "(it carries k <= 360)") in said
    finally:
        lab.run(w, ["ip", "link", "set", "dev", w.iface, "mtu", str(wire.MAX_MTU)])


def test_a_switch_refuses_a_k_its_port_does_not_carry(fresh_lab):
    """fresh_lab: links at the kernel's 1500."""
    r = fresh_lab.run(fresh_lab.switch, SWITCH_CLI + ["up", fresh_lab.switch.iface, "-k",
                                                       str(wire.MTU1500_K + 1)],
                      check=False, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert lines[-1] == (f"Error: --elements: k=361 needs an MTU of at least 1504 on "
                         f"{fresh_lab.switch.iface}, whose MTU is 1500 (it carries k <= 360): "
                         f"raise the MTU of {fresh_lab.switch.iface} and of the network, or use "
                         f"a smaller k"), r.stderr
    assert "Traceback" not in r.stderr


def test_the_user_space_data_plane_takes_the_largest_k():
    """userspace_dp.c's datagram buffers hold a packet of SWML_MAX_K elements."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    x = np.arange(3 * wire.MAX_K + 5, dtype=np.int32) - 1000
    with Lab(workers=2, mtu=wire.MAX_MTU) as lab, \
            SwitchProcess(lab, ["--dataplane", "userspace", "-k", str(wire.MAX_K)]):
        results = run_job(lab, "jumbo-userspace", ["udp"] * 2,
                          lambda rank, w: w.allreduce(x * (rank + 2), op="sum"))
    for out in results:
        np.testing.assert_array_equal(out, 5 * x)


def test_shaped_links_carry_the_largest_frames():
    """TBF on worker links, HTB on the box's: their buckets and quanta hold a
    3506-byte frame, and the job's sums come out exact."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    x = np.arange(4 * wire.MAX_K, dtype=np.int32)
    with Lab(workers=2, mtu=wire.MAX_MTU, rate_mbit=200, box_rate_mbit=400) as lab, \
            SwitchProcess(lab, ["-k", str(wire.MAX_K)]):
        results = run_job(lab, "jumbo-shaped", ["udp"] * 2,
                          lambda rank, w: w.allreduce(x * (rank + 1), op="sum"))
    for out in results:
        np.testing.assert_array_equal(out, 3 * x)
