"""The MTU a packet of k elements needs, and the one-line refusals of a k the
network does not carry (switchml_xdp/mtu.py; docs/performance.md, "Larger
frames"): the numbers all come from xdp/swml_wire.h."""
from __future__ import annotations

import pytest

from switchml_xdp import mtu, net, wire
from switchml_xdp.switch.daemon import SwitchError, check_port_mtus


def test_the_limits_are_the_headers_arithmetic():
    assert wire.IP_OVERHEAD == wire.IP_LEN + wire.UDP_LEN + wire.HDR_LEN
    assert mtu.mtu_needed(wire.MTU1500_K) <= 1500 < mtu.mtu_needed(wire.MTU1500_K + 1)
    assert mtu.mtu_needed(wire.MAX_K) <= wire.MAX_MTU < mtu.mtu_needed(wire.MAX_K + 1)
    # A frame of the largest k fits one page after XDP's headroom and the kernel's
    # tail, and virtio_net's header beside it.
    assert wire.PAGE_FRAME_LEN == 4096 - 256 - 320
    assert wire.ETH_LEN + mtu.mtu_needed(wire.MAX_K) <= wire.PAGE_FRAME_LEN - wire.VNET_HDR_LEN
    assert wire.MAX_K_INT16 == (wire.MAX_MTU - wire.IP_OVERHEAD) // 2
    assert wire.DEFAULT_K == 256 <= wire.MTU1500_K


@pytest.mark.parametrize("link_mtu, k", [(1500, 360), (3494, 858), (3506, 858), (9000, 858), (576, 129),
                                         (60, 0), (0, 0)])
def test_largest_k_an_mtu_carries(link_mtu, k):
    assert mtu.largest_k(link_mtu) == k


def test_a_k_the_mtu_carries_passes_and_one_it_does_not_is_refused_in_one_line():
    mtu.check_k(360, 1500, "eth1")
    mtu.check_k(858, 3494, "eth1")
    with pytest.raises(mtu.MtuError) as e:
        mtu.check_k(361, 1500, "eth1")
    said = str(e.value)
    assert "\n" not in said
    assert "k=361 needs an MTU of at least 1504 on eth1, whose MTU is 1500" in said
    assert "k <= 360" in said
    assert isinstance(e.value, OSError)   # as the worker's join reports its network's errors


def test_the_switch_checks_every_port(monkeypatch):
    mtus = {"p0": 3494, "p1": 1500}
    monkeypatch.setattr(net, "link_mtu", lambda iface, netns=None: mtus[iface])
    check_port_mtus(["p0"], wire.MAX_K)
    check_port_mtus(["p0", "p1"], 360)
    with pytest.raises(SwitchError, match=r"^--elements: k=858 needs an MTU of at least 3492 on p1, "
                                          r"whose MTU is 1500 \(it carries k <= 360\)"):
        check_port_mtus(["p0", "p1"], wire.MAX_K)


@pytest.mark.parametrize("args, says", [
    (["bench", "-k", "256,361"], "k=361 needs --mtu 1504 or more (the lab's MTU is 1500)"),
    (["bench", "-k", "858", "--mtu", "3490"], "k=858 needs --mtu 3492 or more (the lab's MTU is 3490)"),
    (["bench", "--mtu", str(wire.MAX_MTU + 1)], "--mtu"),
    (["bench", "--mtu", "3494", "--racks", "2"], "not with --jobs or --racks"),
    (["up", "--mtu", "100"], "--mtu"),
    (["up", "--mtu", "3494", "--racks", "2"], "not with --racks"),
])
def test_the_labs_mtu_is_checked_before_anything_is_built(args, says):
    from click.testing import CliRunner

    from switchml_xdp.cli import lab as lab_cli

    r = CliRunner().invoke(lab_cli.main, args)
    assert r.exit_code == 2, r.output
    assert says in r.output and "Traceback" not in r.output, r.output


def test_lab_mtu_values():
    from switchml_xdp.lab import LabError
    from switchml_xdp.lab.link_mtu import check_mtu

    assert check_mtu(None) is None and check_mtu(wire.MAX_MTU) == 3494
    for bad in (wire.MAX_MTU + 1, 3506, 9000, 100, "1500", True):
        with pytest.raises(LabError, match=r"^mtu must be an integer from 576 to 3494"):
            check_mtu(bad)


def test_gloos_bound_grows_with_the_mtu_and_swmls_does_not():
    from switchml_xdp.bench import constants

    assert constants.bound_mbps("gloo", 1000, None, 4) == pytest.approx(1000 * 1448 / 1514 * 4 / 6)
    assert constants.bound_mbps("gloo", 1000, None, 4, mtu=3494) == pytest.approx(
        1000 * 3442 / 3508 * 4 / 6)
    for k in (256, wire.MAX_K):
        assert constants.bound_mbps("swml-afxdp", 1000, k, 4, mtu=3494) == \
            constants.bound_mbps("swml-afxdp", 1000, k, 4) == pytest.approx(
                1000 * 4 * k / (wire.HEADERS_LEN + 4 * k))
