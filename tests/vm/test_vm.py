"""The VM lab (switchml_xdp/lab/vm.py): a switch VM and two worker VMs on
virtio-net NICs, booted with qemu on this machine (KVM where it works, TCG
otherwise: about three minutes here), the switch in native XDP, afxdp workers.

The boot pieces are checked on their own first (cheap); the whole lab once.
Everything skips, saying why, where qemu, the guest kernel or root is missing
(`scripts/setup.sh --vm`, which `make test` and `make vm-test` run, installs them).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from switchml_xdp.lab import netns, vm_boot

WHY_NOT = vm_boot.missing()
needs_vms = pytest.mark.skipif(WHY_NOT is not None, reason=f"no VM lab here: {WHY_NOT}")


@needs_vms
def test_the_initramfs_holds_busybox_the_init_and_the_modules_in_dependency_order(tmp_path):
    kernel = vm_boot.find_guest_kernel()
    order = [p.name for p in vm_boot.module_closure(kernel, vm_boot.INITRAMFS_MODULES)]
    for module, needs in [("virtio_pci.ko", "virtio.ko"), ("9pnet_virtio.ko", "9pnet.ko"),
                          ("9p.ko", "9pnet.ko")]:
        assert order.index(needs) < order.index(module), order
    cpio = vm_boot.build_initramfs(kernel, tmp_path / "initramfs.cpio")
    listing = subprocess.run(["cpio", "-t", "--quiet"], stdin=open(cpio, "rb"), capture_output=True,
                             text=True, check=True).stdout.split()
    assert {"init", "bin/busybox", "modules/order", *(f"modules/{m}" for m in order)} <= set(listing)


@needs_vms
@pytest.mark.timeout(900)
def test_switch_vm_and_two_afxdp_worker_vms_reduce_exactly_in_native_xdp(capsys):
    from switchml_xdp.lab.vm import VmLab

    lines = []
    with VmLab(workers=2, out=lines.append) as lab:
        results = lab.bench(size="64KiB", iterations=2, warmup=1, dtype="float32", verify=True)
        status = lab.switch_status()
        prefix, run_dir, ns = lab.prefix, lab.run_dir, lab.net.ns
        procs = [vm.proc for vm in lab.vms]
    # bench() itself refuses anything but native XDP (the daemon's ready line
    # and the guest's `ip -d link` both); say what ran, for the log.
    with capsys.disabled():
        print("\n" + "\n".join(lines) + f"\n{lab.switch_ready_line}\n{lab.timings}")
    assert "native XDP" in lab.switch_ready_line
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["backend"] == "afxdp" and r["dtype"] == "float32"
        assert r["verify_failures"] == 0 and r["verified"] == 3, r   # bit-exact, every call
    # The switch VM's own `swml-switch status --json`, read as the daemon stopped.
    [switch] = status["switches"]
    assert switch["mode"] == "native" and switch["iface"] == "eth0", switch
    rounds = 3 * -(-(64 * 1024 // 4) // results[0]["k"])   # calls x packets a call
    assert switch["counters"]["completed"] >= rounds, switch["counters"]
    # Nothing of the run is left: no qemu, no namespace (bridge, taps), no run directory.
    assert all(p.poll() is not None for p in procs)
    assert not netns.ns_path(ns).exists()
    assert not run_dir.exists()
    assert prefix.startswith("swv")


def _serve_one_worker_vm(capsys, switch_args: tuple[str, ...], box_ports: int = 1,
                         tree: bool = False, mtu: int | None = None,
                         bench_args: tuple[str, ...] = (), results_out: list | None = None) -> dict:
    """A switch VM (`swml-switch up ... SWITCH_ARGS`) and one worker VM that
    reduces through it (`swml-worker bench ... BENCH_ARGS`) and checks every
    result; the switch's status (the worker's results into `results_out`)."""
    from switchml_xdp.lab.vm import VmLab

    lines = []
    with VmLab(workers=1, switch_args=switch_args, out=lines.append, box_ports=box_ports,
               tree=tree, **({"mtu": mtu} if mtu else {})) as lab:
        results = lab.bench(size="16KiB", iterations=2, warmup=1, dtype="float32", verify=True,
                            extra=bench_args)
        status = lab.switch_status()
    if results_out is not None:
        results_out.extend(results)
    with capsys.disabled():
        print("\n" + "\n".join(lines) + f"\n{lab.switch_ready_line}")
    assert results[0]["verify_failures"] == 0 and results[0]["verified"] == 3, results
    [switch] = status["switches"]
    return switch


@needs_vms
@pytest.mark.timeout(900)
@pytest.mark.parametrize("tree", [False, True], ids=["box", "rack-box"])
def test_the_largest_k_loads_and_serves_on_debian_12_s_kernel_at_mtu_3494(capsys, tree):
    """k = SWML_MAX_K (858 int32, a 3506-byte frame): the switch program's
    longest loops pass Debian 12's verifier (6.1), a rack box's build (the
    largest) too, virtio_net takes native XDP at MTU 3494 and such frames
    with it, and the afxdp worker's page-sized UMEM frames carry the packets
    (docs/performance.md, "Larger frames")."""
    from switchml_xdp import wire

    switch = _serve_one_worker_vm(capsys, ("-k", str(wire.MAX_K)), tree=tree, mtu=wire.MAX_MTU)
    assert switch["params"]["k"] == wire.MAX_K and switch["mode"] == "native", switch
    c = switch["counters"]
    assert c["completed"] >= 3 * -(-(16 * 1024 // 4) // wire.MAX_K), c
    if tree:
        assert c["sent_up"] == c["completed"] and c["from_parent"] >= c["completed"], c


@needs_vms
@pytest.mark.timeout(900)
def test_a_worker_vm_streams_in_two_lanes_over_its_multi_queue_virtio_nic(capsys):
    """Lanes (docs/performance.md, "Several queues per worker") on the udp
    backend across virtio-net with several queue pairs and the switch in
    native XDP on Debian 12's kernel: the switch takes slot s's DATA only
    from the worker's port + (s mod 2) and sends its RESULT there, so a
    call completes exactly only if both lanes carried their share."""
    results: list = []
    switch = _serve_one_worker_vm(capsys, (), bench_args=("--backend", "udp", "--lanes", "2"),
                                  results_out=results)
    [r] = results
    assert r["backend"] == "udp" and r["lanes"] == 2, r
    c = switch["counters"]
    assert c["completed"] >= 3 * -(-(16 * 1024 // 4) // r["k"]) and c["bad_source"] == 0, c


@needs_vms
@pytest.mark.timeout(900)
def test_the_unicast_fanout_loads_and_serves_on_debian_12_s_kernel(capsys):
    """The tc fan-out program (xdp/swml_fanout.c: copies, trimmed header-only
    copies re-signed) passes Debian 12's verifier (6.1, stricter than the
    host's) and gets every RESULT to the worker VM."""
    switch = _serve_one_worker_vm(capsys, ("--fanout", "unicast"))
    c = switch["counters"]
    assert switch["fanout"] == "unicast" and c["unicast_copies"] >= c["completed"] > 0, c
    assert c["unicast_no_meta"] == c["unicast_clone_failed"] == 0, c


@needs_vms
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fanout, rack_ports", [("multicast", 1), ("unicast", 1), ("multicast", 2)])
def test_a_rack_box_and_its_parent_serve_a_worker_vm_on_debian_12_s_kernel(capsys, fanout,
                                                                           rack_ports):
    """The rack box's build of the switch program (xdp/swml_tree.h: a round
    up to the parent out of the uplink, the parent's RESULT down to the
    members; with two rack ports, the devmap broadcast too) passes Debian
    12's verifier (6.1); with its parent in the same VM behind a veth, the
    tree serves the worker VM exactly, every round going up and coming
    down."""
    switch = _serve_one_worker_vm(capsys, ("--fanout", fanout), box_ports=rack_ports, tree=True)
    c = switch["counters"]
    assert c["sent_up"] == c["completed"] > 0, c
    assert c["from_parent"] >= c["completed"] and c["bad_parent"] == 0, c


@needs_vms
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fanout", ["multicast", "unicast"])
def test_a_box_with_two_ports_loads_and_serves_on_debian_12_s_kernel(capsys, fanout):
    """The switch program built for a box of several ports (the devmap
    broadcast of multicast RESULTs; unicast copies out of each member's
    learnt port) passes Debian 12's verifier (6.1) and serves the worker VM
    through one of the ports, counting per port."""
    switch = _serve_one_worker_vm(capsys, ("--fanout", fanout), box_ports=2)
    assert switch["ports"] == ["eth0", "swp1"], switch
    nic, veth = switch["port_stats"]
    c = switch["counters"]
    assert nic["rx_packets"] == c["rx"] > 0 and veth["rx_packets"] == 0, switch["port_stats"]
    assert nic["tx_packets"] >= c["completed"] > 0, switch["port_stats"]


@needs_vms
def test_a_lab_that_fails_while_booting_leaves_nothing(monkeypatch):
    """The switch VM's qemu is started for real, then the first worker fails to start."""
    from switchml_xdp.lab import vm as vm_mod

    real_start = vm_mod.VmLab._start

    def start_then_fail(self, vm, kernel, initramfs):
        if vm.role == "worker":
            raise RuntimeError("injected failure")
        real_start(self, vm, kernel, initramfs)

    monkeypatch.setattr(vm_mod.VmLab, "_start", start_then_fail)
    lab = vm_mod.VmLab(workers=1, accel="tcg", out=lambda line: None)
    with pytest.raises(RuntimeError, match="injected"), lab:
        lab.boot()
    assert lab.switch.proc is not None and lab.switch.proc.poll() is not None
    assert not netns.ns_path(lab.net.ns).exists()
    assert not lab.run_dir.exists()
    assert not vm_mod.state_path(lab.prefix).exists()


@needs_vms
def test_a_lab_whose_owner_died_is_removed_by_the_next_one():
    from switchml_xdp.lab import vm as vm_mod
    from switchml_xdp.lab.vm_net import VmNetwork

    dead = subprocess.Popen(["true"])
    dead.wait()
    prefix = vm_mod.new_prefix()
    net = VmNetwork(prefix, vm_mod.MTU)
    run_dir = Path("/tmp") / f"{prefix}-leftover"
    try:
        net.create()
        run_dir.mkdir()
        vm_mod.state_path(prefix).parent.mkdir(parents=True, exist_ok=True)
        vm_mod.state_path(prefix).write_text(f'{{"owner_pid": {dead.pid}}}\n')
        assert prefix in vm_mod.remove_orphans()
        assert not netns.ns_path(net.ns).exists()
        assert not run_dir.exists()
        assert not vm_mod.state_path(prefix).exists()
    finally:
        net.remove()
        shutil.rmtree(run_dir, ignore_errors=True)
        vm_mod.state_path(prefix).unlink(missing_ok=True)
