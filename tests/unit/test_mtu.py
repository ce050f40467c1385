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
    # A frame of the largest k fits one page after XDP's headroom and the kernel's tail.
    assert wire.ETH_LEN + mtu.mtu_needed(wire.MAX_K) <= wire.PAGE_FRAME_LEN == 4096 - 256 - 320
    assert wire.MAX_K_INT16 == (wire.MAX_MTU - wire.IP_OVERHEAD) // 2
    assert wire.DEFAULT_K == 256 <= wire.MTU1500_K


@pytest.mark.parametrize("link_mtu, k", [(1500, 360), (3506, 861), (9000, 861), (576, 129),
                                         (60, 0), (0, 0)])
def test_largest_k_an_mtu_carries(link_mtu, k):
    assert mtu.largest_k(link_mtu) == k


def test_a_k_the_mtu_carries_passes_and_one_it_does_not_is_refused_in_one_line():
    mtu.check_k(360, 1500, "eth1")
    mtu.check_k(861, 3506, "eth1")
    with pytest.raises(mtu.MtuError) as e:
        mtu.check_k(361, 1500, "eth1")
    said = str(e.value)
    assert "\n" not in said
    assert "k=361 needs an MTU of at least 1504 on eth1, whose MTU is 1500" in said
    assert "k <= 360" in said
    assert isinstance(e.value, OSError)   # as the worker's join reports its network's errors


def test_the_switch_checks_every_port(monkeypatch):
    mtus = {"p0": 3506, "p1": 1500}
    monkeypatch.setattr(net, "link_mtu", lambda iface, netns=None: mtus[iface])
    check_port_mtus(["p0"], wire.MAX_K)
    check_port_mtus(["p0", "p1"], 360)
    with pytest.raises(SwitchError, match=r"^--elements: k=861 needs an MTU of at least 3504 on p1, "
                                          r"whose MTU is 1500 \(it carries k <= 360\)"):
        check_port_mtus(["p0", "p1"], wire.MAX_K)
