"""A box with several ports, without a kernel: the port list's checks, what
the data plane compiles in about the ports, the lab's addressing of them
(switch/ports.py, lab/box_ports.py; the lab and VM tests run them)."""
from __future__ import annotations

import pytest

from switchml_xdp import net
from switchml_xdp.lab import box_ports as lab_ports
from switchml_xdp.lab.addressing import SWITCH_IP, peer_mac, port_host, segment_bridge
from switchml_xdp.lab.errors import LabError
from switchml_xdp.switch import daemon, ports
from switchml_xdp.switch.dataplane import DataplaneError, SwitchParams


def test_the_port_list_is_checked_with_a_reason():
    assert ports.check_ports(["eth1", "eth2"]) == ["eth1", "eth2"]
    with pytest.raises(DataplaneError, match="eth2 given twice"):
        ports.check_ports(["eth1", "eth2", "eth2"])
    with pytest.raises(DataplaneError, match=f"at most {ports.MAX_PORTS} ports"):
        ports.check_ports([f"eth{i}" for i in range(ports.MAX_PORTS + 1)])
    with pytest.raises(DataplaneError, match="give the box's port"):
        ports.check_ports([])


def test_one_port_compiles_in_nothing_several_their_count():
    assert ports.port_defines([7]) == {}
    assert ports.port_defines([7, 9, 12]) == {"SWML_PORTS": 3}


def test_the_ports_of_a_box_must_share_one_bridge(monkeypatch):
    masters = {"eth1": "br0", "eth2": None}
    monkeypatch.setattr(net, "link_master", lambda p: masters[p])
    with pytest.raises(DataplaneError, match=r"members of one bridge, .*\(eth1 in br0, eth2 in no bridge"):
        ports.box_address(["eth1", "eth2"])
    masters["eth2"] = "br1"
    with pytest.raises(DataplaneError, match="eth1 in br0, eth2 in br1"):
        ports.box_address(["eth1", "eth2"])
    masters["eth2"] = "br0"
    monkeypatch.setattr(net, "link_ipv4", lambda i: {"br0": "10.0.0.1"}[i])
    monkeypatch.setattr(net, "link_mac", lambda i: {"br0": "02:00:00:00:00:01"}[i])
    assert ports.box_address(["eth1", "eth2"]) == ("10.0.0.1", "02:00:00:00:00:01", "br0")


def test_only_the_xdp_data_plane_takes_several_ports():
    with pytest.raises(daemon.SwitchError, match="several ports needs the xdp data plane"):
        daemon.make_dataplane("userspace", "eth1", SwitchParams(), ports=["eth1", "eth2"])


def test_the_lab_s_ports_have_their_own_names_macs_and_segments():
    p1, p3 = port_host("swlab", 1), port_host("swlab", 3)
    assert (p1.name, p1.ns, p1.iface, p1.peer) == ("swp1", "swlab-sw", "swlab-sp1", "swlab-bsp1")
    assert p1.ip == SWITCH_IP and len({p1.mac, p3.mac, peer_mac(p1), peer_mac(p3)}) == 4
    assert segment_bridge("swlab", 2) == "swlab-br2"
    assert [lab_ports.segment_of(i, 3) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    assert [p.name for p in lab_ports.extra_ports("swlab", 3)] == ["swp1", "swp2"]


@pytest.mark.parametrize("ports_, boxes, igmp, why", [
    (0, 1, False, "ports must be an integer"), (9, 1, False, "ports must be an integer"),
    (2, 2, False, "several boxes or a box with several ports"), (2, 1, True, "snooping")])
def test_a_lab_refuses_ports_it_cannot_build(ports_, boxes, igmp, why):
    with pytest.raises(LabError, match=why):
        lab_ports.check_ports(ports_, boxes, igmp)
