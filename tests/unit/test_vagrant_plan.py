"""The vagrant lab without booting VMs: the Vagrantfile parses (`ruby -c`) and,
evaluated against a recording stand-in for Vagrant's DSL, defines the VMs,
addresses and provisioner arguments of vagrant/cluster.json; the scripts pass
shellcheck; provisioning refuses bad arguments. With root: tests/vm/test_vagrant.py."""
from __future__ import annotations

import ipaddress
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from vagrant_plan import IS_ROOT, REPO, VAGRANT, flags, make_netns, needs_plan, needs_ruby, record_vagrantfile


# --------------------------------------------------------------------------
# The Vagrantfile: syntax, vagrant validate
# --------------------------------------------------------------------------
@needs_ruby
def test_vagrantfile_ruby_syntax():
    r = subprocess.run(["ruby", "-c", str(VAGRANT / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stdout + r.stderr


@needs_plan
@pytest.mark.parametrize("workers", [None, 1, 5, 64])
def test_plan_addresses_and_ranks(workers):
    p = plan(workers)
    n = CLUSTER["workers"] if workers is None else workers
    net = CLUSTER["network"]
    subnet = ipaddress.ip_network(net["subnet"])
    ms = p["machines"]
    switches = [m for m in ms if m["flags"]["--role"] == "switch"]
    workers_ = [m for m in ms if m["flags"]["--role"] == "worker"]
    assert len(switches) == 1 and len(workers_) == n and len(ms) == n + 1
    sw = switches[0]
    assert sw["name"] == CLUSTER["switch"]["hostname"] and sw["primary"] is True
    switch_ip = sw["net"]["ip"]
    assert switch_ip == net["switch_ip"] == sw["flags"]["--ip"]

    # Ranks: 0..n-1, once each, in the names and addresses cluster.json documents.
    assert sorted(int(m["flags"]["--rank"]) for m in workers_) == list(range(n))
    for m in workers_:
        r = int(m["flags"]["--rank"])
        assert m["name"] == m["hostname"][0] == f"{CLUSTER['worker']['hostname_prefix']}{r}"
        assert m["net"]["ip"] == str(ipaddress.ip_address(net["worker_ip_base"]) + r)
        assert m["flags"]["--ip"] == m["net"]["ip"]
        assert "--elements" not in m["flags"] and "--mode" not in m["flags"]
    assert sw["hostname"] == [sw["name"]] and "--rank" not in sw["flags"]

    # One network: every address a distinct usable host of the subnet, not the
    # host-side bridge's (.1), with the subnet's mask.
    ips = [ipaddress.ip_address(m["net"]["ip"]) for m in ms]
    assert len(set(ips)) == len(ips)
    hosts = list(subnet.hosts())
    assert all(ip in subnet and ip != hosts[0] and ip != subnet.broadcast_address for ip in ips)
    assert {m["net"]["netmask"] for m in ms} == {str(subnet.netmask)}

    # What every VM is told about the switch and the job is the same, and is the switch's.
    for m in ms:
        f = m["flags"]
        assert f["--switch-ip"] == switch_ip
        assert f["--world"] == str(n)
        assert f["--job"] == CLUSTER["job"]
        assert f["--control-port"] == str(CLUSTER["switch"]["control_port"])
        assert f["--mtu"] == str(net["mtu"])
    f = sw["flags"]
    assert (f["--elements"], f["--slots"], f["--port"], f["--mode"]) == tuple(
        str(CLUSTER["switch"][k]) for k in ("elements", "slots", "port", "mode"))


@needs_plan
def test_plan_network_and_providers():
    p = plan(3, SWML_CPUS="4")
    net = CLUSTER["network"]
    queues = CLUSTER["vm"]["queue_pairs_per_cpu"] * 4
    for m in p["machines"]:
        kw = m["net"]
        assert kw["virtualbox__intnet"] == kw["libvirt__network_name"] == net["name"]
        assert kw["nic_type"] == "virtio"
        assert kw["libvirt__driver_queues"] == queues
        assert kw["libvirt__forward_mode"] == "none" and kw["libvirt__dhcp_enabled"] is False
        assert kw["libvirt__mtu"] == net["mtu"]
    lv = p["providers"]["libvirt"]
    assert {"path": ["cpus"], "set": 4} in lv
    qargs = [e["kw"]["value"] for e in lv if e["path"] == ["qemuargs"]]
    assert qargs[0::2] == ["-global"] * (len(qargs) // 2)
    assert {a.split("=")[0] for a in qargs[1::2]} >= {"virtio-net-pci.guest_tso4",
                                                      "virtio-net-pci.guest_tso6"}
    vb = p["providers"]["virtualbox"]
    assert {"path": ["default_nic_type"], "set": "virtio"} in vb and {"path": ["cpus"], "set": 4} in vb
    assert p["box"] == [CLUSTER["box"]]
    # The checkout reaches the VMs where the provisioner runs it from.
    synced = {e["args"][0]: e for e in p["synced"]}
    assert synced[".."]["args"][1] == CLUSTER["repo_dir"] and synced[".."]["kw"]["type"] == "rsync"
    assert synced["."]["kw"].get("disabled") is True
    for m in p["machines"]:
        assert shlex.split(m["inline"])[:3] == ["exec", "bash", f"{CLUSTER['repo_dir']}/vagrant/provision.sh"]


@needs_plan
@pytest.mark.parametrize("env", [{"SWML_WORKERS": "0"}, {"SWML_WORKERS": "65"},
                                 {"SWML_WORKERS": "two"}, {"SWML_CPUS": "0"}])
def test_plan_rejects_bad_settings(env):
    r = record_vagrantfile(env)
    name = next(iter(env))
    assert r.returncode != 0 and name in r.stderr, r.stderr


@needs_plan
@pytest.mark.parametrize("workers", [1, 3])
def test_provisioned_commands_agree_with_the_plan(workers, tmp_path):
    try:
        from switchml_xdp.cli import switch as switch_cli
        from switchml_xdp.cli import worker as worker_cli
    except ImportError as e:
        pytest.skip(f"switchml_xdp's CLIs do not import here ({e}); run `make test`")
    p = plan(workers)
    subnet = ipaddress.ip_network(CLUSTER["network"]["subnet"])
    tag = uuid.uuid4().hex[:6]
    stub = tmp_path / "swml-worker"
    stub.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "json.dump(sys.argv[1:], open(os.environ['ARGV_OUT'], 'w'))\n")
    stub.chmod(0o755)
    nets = []
    try:
        seen = {}
        for i, m in enumerate(p["machines"]):
            root = tmp_path / m["name"]
            if IS_ROOT:
                # The VM's view: its address on a NIC; provision.sh finds the NIC by it.
                ns, iface = f"swvg{tag}{i}", f"lab{i}"
                make_netns(ns, m["net"]["ip"], subnet.prefixlen, iface)
                nets.append(ns)
                provision(m, root, netns=ns)
            else:
                ns, iface = None, "eth1"
                provision(m, root, iface=iface)
            again = provision(m, root, netns=ns, iface=None if ns else iface)
            assert "files already in place" in again.stdout, again.stdout

            env = dict(line.split("=", 1) for line in
                       (root / "etc/switchml-xdp/vm.env").read_text().splitlines()
                       if line and not line.startswith("#"))
            assert env["SWML_IFACE"] == iface and env["SWML_IP"] == m["net"]["ip"]
            for b in ("swml-switch", "swml-worker", "swml-lab"):
                assert os.readlink(root / "usr/local/bin" / b) == f"{REPO}/.venv/bin/{b}"
            # The NIC unit and its script are packaging/'s, as a real install has them.
            for installed, packaged in (("etc/systemd/system/swml-nic.service", "swml-nic.service"),
                                        ("usr/local/sbin/swml-tune-nic", "tune-nic.sh")):
                assert (root / installed).read_bytes() == (REPO / "packaging" / packaged).read_bytes()
            assert os.access(root / "usr/local/sbin/swml-tune-nic", os.X_OK)
            nic_env = (root / "etc/swml/nic.env").read_text()
            assert f"SWML_IFACE={iface}\n" in nic_env and f"SWML_ROLE={m['flags']['--role']}\n" in nic_env

            if m["flags"]["--role"] == "switch":
                unit = (root / "etc/systemd/system/swml-switch.service").read_text()
                [line] = [x for x in unit.splitlines() if x.startswith("ExecStart=")]
                argv = shlex.split(line[len("ExecStart="):])
                assert argv[0] == f"{REPO}/.venv/bin/swml-switch" and argv[1] == "up", argv
                seen["switch"] = (m, _click_params(switch_cli.up, argv[2:]))
                assert not (root / "usr/local/bin/swml-bench").exists()
            else:
                assert not (root / "etc/systemd/system/swml-switch.service").exists()
                out = tmp_path / f"{m['name']}.argv"
                r = subprocess.run([str(root / "usr/local/bin/swml-bench"), "--verify"],
                                   env={**os.environ, "SWML_ENV_FILE": str(root / "etc/switchml-xdp/vm.env"),
                                        "SWML_WORKER_BIN": str(stub), "ARGV_OUT": str(out)},
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, r.stderr
                argv = json.loads(out.read_text())
                assert argv[0] == "bench", argv
                seen[m["name"]] = (m, _click_params(worker_cli.bench, argv[1:]))
                if ns:
                    # swml-worker picks its NIC by the route to the switch: the lab NIC.
                    route = subprocess.run(["ip", "-n", ns, "-j", "route", "get", m["flags"]["--switch-ip"]],
                                           capture_output=True, text=True, check=True)
                    assert json.loads(route.stdout)[0]["dev"] == iface
    finally:
        for ns in nets:
            subprocess.run(["ip", "netns", "del", ns], check=False)

    sw_m, sw = seen.pop("switch")
    assert sw["iface"] == (f"lab{p['machines'].index(sw_m)}" if IS_ROOT else "eth1")
    cfg = CLUSTER["switch"]
    assert (sw["elements"], sw["slots"], sw["port"], sw["control_port"]) == (
        cfg["elements"], cfg["slots"], cfg["port"], cfg["control_port"])
    assert sw["mode"] == (None if cfg["mode"] == "auto" else cfg["mode"])
    ranks = []
    for m, w in seen.values():
        assert w["boxes"] == [sw_m["net"]["ip"]]   # the address the switch VM was given
        assert w["rank"] == int(m["flags"]["--rank"])
        assert w["world"] == workers
        assert w["job"] == CLUSTER["job"]
        assert w["control_port"] == sw["control_port"]
        assert w["verify"] is True                     # the caller's options pass through
        ranks.append(w["rank"])
    assert sorted(ranks) == list(range(workers))


@pytest.mark.parametrize("change, message", [
    ({"--rank": "3"}, "--rank must be an integer in 0..2"),
    ({"--switch-ip": "10.77.0.300"}, "--switch-ip must be an IPv4 address"),
    ({"--ip": "10.77.0.10"}, "cannot have the switch's address"),
    ({"--job": "a b"}, "--job must be"),
    ({"--role": "router"}, "--role must be switch or worker"),
])
def test_provision_rejects_bad_arguments(change, message, tmp_path):
    args = {"--role": "worker", "--ip": "10.77.0.101", "--switch-ip": "10.77.0.10", "--world": "3",
            "--job": "vm", "--control-port": "48865", "--mtu": "1500", "--rank": "1", **change}
    m = {"args": [x for kv in args.items() for x in kv]}
    r = provision(m, tmp_path, iface="eth1", check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (tmp_path / "etc").exists()


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_vagrant_scripts_pass_shellcheck():
    scripts = [VAGRANT / n for n in ("provision.sh", "bench.sh", "swml-bench")]
    scripts.append(REPO / "packaging/tune-nic.sh")
    r = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_vagrant_scripts_parse():
    bash_scripts = [VAGRANT / "provision.sh", VAGRANT / "bench.sh", REPO / "packaging/tune-nic.sh"]
    for path in bash_scripts:
        subprocess.run(["bash", "-n", str(path)], check=True)
    subprocess.run(["sh", "-n", str(VAGRANT / "swml-bench")], check=True)
    assert all(os.access(path, os.X_OK) for path in (*bash_scripts, VAGRANT / "swml-bench"))


CLUSTER = json.loads((VAGRANT / "cluster.json").read_text())


def plan(workers: int | None = None, **env) -> dict:
    if workers is not None:
        env["SWML_WORKERS"] = str(workers)
    r = record_vagrantfile(env)
    assert r.returncode == 0, r.stderr
    log = json.loads(r.stdout)
    top = {"synced": [e for e in log if e["path"] == ["vm", "synced_folder"]],
           "providers": {e["args"][0]: e["block"] for e in log if e["path"] == ["vm", "provider"]},
           "box": [e["set"] for e in log if e["path"] == ["vm", "box"]], "machines": []}
    for d in (e for e in log if e["path"] == ["vm", "define"]):
        block = d["block"]
        nets = [e for e in block if e["path"] == ["vm", "network"]]
        provs = [e for e in block if e["path"] == ["vm", "provision"]]
        assert len(nets) == 1 and nets[0]["args"] == ["private_network"], nets
        assert len(provs) == 1 and provs[0]["args"] == ["shell"], provs
        top["machines"].append({
            "name": d["args"][0], "primary": d["kw"].get("primary", False),
            "hostname": [e["set"] for e in block if e["path"] == ["vm", "hostname"]],
            "net": nets[0]["kw"], "inline": provs[0]["kw"]["inline"],
            "args": provs[0]["kw"]["args"], "flags": flags(provs[0]["kw"]["args"])})
    return top


def provision(machine: dict, root: Path, netns: str | None = None, iface: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
    """Run vagrant/provision.sh with the Vagrantfile's arguments for this VM, writing
    under root (no set-up, no systemctl), in netns if given (where the VM's address is)."""
    cmd = ["bash", str(VAGRANT / "provision.sh"), *machine["args"]]
    if iface:
        cmd += ["--iface", iface]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWML_")}  # as in a VM
    r = subprocess.run(cmd, env={**env, "SWML_PROVISION_ROOT": str(root)},
                       capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _click_params(command, argv: list[str]) -> dict:
    ctx = command.make_context(command.name, list(argv))
    return dict(ctx.params)
