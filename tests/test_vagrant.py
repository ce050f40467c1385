"""The VM lab (vagrant/) and the set-up it provisions with (scripts/setup.sh).

What this machine can check without booting VMs:
- scripts/setup.sh run twice: the second run does nothing and exits 0, also after
  the package has been imported (bytecode written into the tree);
- the Vagrantfile: `ruby -c`, and `vagrant validate` for libvirt and VirtualBox
  where vagrant is installed;
- the plan: the real Vagrantfile is evaluated against a recording stand-in for
  Vagrant's config DSL, so the test sees exactly which VMs it defines, the address
  each one gets and the arguments its provisioner gets; those must agree with
  vagrant/cluster.json, and, once vagrant/provision.sh has turned them into files,
  with what reaches `swml-switch up` (its systemd unit) and `swml-worker bench` (the
  swml-bench wrapper), parsed by the real click commands;
- vagrant/tune-nic.sh: the queue-pair arithmetic (with a stand-in ethtool) and its
  idempotence on a veth.
"""
from __future__ import annotations

import ipaddress
import json
import os
import py_compile
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VAGRANT = REPO / "vagrant"
CLUSTER = json.loads((VAGRANT / "cluster.json").read_text())
IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (set-up, network namespaces)")
needs_ruby = pytest.mark.skipif(shutil.which("ruby") is None,
                                reason="ruby is not installed (apt-get install ruby)")

# --------------------------------------------------------------------------
# scripts/setup.sh
# --------------------------------------------------------------------------
VENV = Path(os.environ.get("SWML_VENV", REPO / ".venv"))


def _run_setup() -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], capture_output=True,
                          text=True, timeout=900)


def _venv_fingerprint() -> dict:
    """What a second set-up run must leave alone."""
    out = {}
    for p in [VENV / "bin" / "python", VENV / "pyvenv.cfg", VENV / ".swml-installed",
              *sorted((REPO / "switchml_xdp").glob("_engine*.so"))]:
        st = os.lstat(p)
        out[str(p)] = (st.st_ino, st.st_mtime_ns)
    build = Path(f"/lib/modules/{os.uname().release}/build")
    out[str(build)] = os.readlink(build) if build.is_symlink() else "not a link"
    return out


@needs_root
def test_setup_sh_second_run_changes_nothing():
    if not (VENV / ".swml-installed").exists():
        pytest.skip(f"scripts/setup.sh has not run here yet (no {VENV}/.swml-installed); "
                    "`make test` runs it before the tests")
    # The first run may still have work if sources changed since the last set-up
    # (under `make test` it has none); either way it must succeed.
    first = _run_setup()
    assert first.returncode == 0, first.stdout + first.stderr
    # What a test session leaves in the tree: fresh bytecode caches (CI writes them).
    py_compile.compile(str(REPO / "switchml_xdp" / "wire.py"), doraise=True)
    before = _venv_fingerprint()
    second = _run_setup()
    out = second.stdout + second.stderr
    assert second.returncode == 0, out
    assert "Debian packages present" in out, out
    assert "already installed" in out, out
    for work in ("installing", "creating", "mounting", "linking", "WARNING"):
        assert work not in out, f"the second set-up run did work ({work!r}):\n{out}"
    assert _venv_fingerprint() == before, "the second set-up run touched the venv or the headers"


# --------------------------------------------------------------------------
# The Vagrantfile: syntax, vagrant validate
# --------------------------------------------------------------------------
@needs_ruby
def test_vagrantfile_ruby_syntax():
    r = subprocess.run(["ruby", "-c", str(VAGRANT / "Vagrantfile")], capture_output=True, text=True)
    assert r.returncode == 0 and "Syntax OK" in r.stdout, r.stdout + r.stderr


def _vagrant(args: list[str], tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),  # keep vagrant/ clean
            "VAGRANT_CHECKPOINT_DISABLE": "1", **(env or {})}
    return subprocess.run(["vagrant", *args], cwd=VAGRANT, env=full, capture_output=True, text=True,
                          timeout=180)


@pytest.mark.skipif(shutil.which("vagrant") is None,
                    reason="vagrant is not installed (Debian: apt-get install vagrant); "
                           "test_vagrantfile_ruby_syntax still checks the syntax")
@pytest.mark.parametrize("provider", ["libvirt", "virtualbox"])
def test_vagrant_validate(provider, tmp_path):
    env = {"VAGRANT_DEFAULT_PROVIDER": provider, "SWML_WORKERS": "3"}
    if provider == "virtualbox" and shutil.which("VBoxManage") is None:
        # Vagrant validates VirtualBox settings only where it finds VBoxManage; this
        # stand-in answers the version query, which is all `validate` asks of it.
        stub = tmp_path / "bin" / "VBoxManage"
        stub.parent.mkdir()
        stub.write_text('#!/bin/sh\n[ "$1" = --version ] && echo 7.0.14r161095\nexit 0\n')
        stub.chmod(0o755)
        env["PATH"] = f"{stub.parent}:{os.environ['PATH']}"
    r = _vagrant(["validate"], tmp_path, env)
    out = r.stdout + r.stderr
    if provider == "libvirt" and "provider 'libvirt' could not be found" in out:
        pytest.skip("the vagrant-libvirt plugin is not installed (apt-get install vagrant-libvirt)")
    assert r.returncode == 0 and "validated successfully" in out, out


# --------------------------------------------------------------------------
# The plan the Vagrantfile hands the VMs
# --------------------------------------------------------------------------
# A stand-in for Vagrant: Vagrant.configure yields a recorder, which logs every
# assignment and call (with its block's calls nested), and the log is printed as JSON.
RECORDER_RB = r'''
require "json"

class Recorder < BasicObject
  def initialize(log, path)
    @log = log
    @path = path
  end

  def method_missing(name, *args, **kw, &blk)
    n = name.to_s
    if n.end_with?("=")
      @log << { "path" => @path + [n.chomp("=")], "set" => args[0] }
      return args[0]
    end
    return ::Recorder.new(@log, @path + [n]) if args.empty? && kw.empty? && blk.nil?
    entry = { "path" => @path + [n], "args" => args, "kw" => kw }
    @log << entry
    if blk
      entry["block"] = []
      subs = (0...[blk.arity, 1].max).map { |i| ::Recorder.new(entry["block"], i.zero? ? [] : ["override"]) }
      blk.call(*subs)
    end
    nil
  end

  def respond_to_missing?(*)
    true
  end
end

module Vagrant
  LOG = []
  def self.configure(version)
    LOG << { "path" => ["configure"], "args" => [version] }
    yield ::Recorder.new(LOG, [])
  end

  def self.require_version(*) end
end

load ARGV.fetch(0)
puts JSON.generate(Vagrant::LOG)
'''


def record_vagrantfile(env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWML_")}
    return subprocess.run(["ruby", "-e", RECORDER_RB, str(VAGRANT / "Vagrantfile")],
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=60)


def flags(args: list[str]) -> dict[str, str]:
    """provision.sh's arguments: every option takes one value."""
    assert len(args) % 2 == 0 and all(a.startswith("--") for a in args[::2]), args
    d = dict(zip(args[::2], args[1::2]))
    assert len(d) == len(args) // 2, f"an option given twice: {args}"
    return d


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


needs_plan = needs_ruby


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
    assert {a.split("=")[0] for a in qargs[1::2]} >= {"virtio-net-pci.guest_tso4", "virtio-net-pci.guest_tso6"}
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


# --------------------------------------------------------------------------
# From the plan to the command lines: provision.sh's files
# --------------------------------------------------------------------------
def _netns(name: str, ip: str, prefix: int, iface: str) -> None:
    subprocess.run(["ip", "netns", "add", name], check=True)
    ns = ["ip", "-n", name]
    subprocess.run([*ns, "link", "add", iface, "type", "veth", "peer", "name", iface + "p"], check=True)
    subprocess.run([*ns, "addr", "add", f"{ip}/{prefix}", "dev", iface], check=True)
    for dev in (iface, iface + "p"):
        subprocess.run([*ns, "link", "set", dev, "up"], check=True)


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
                _netns(ns, m["net"]["ip"], subnet.prefixlen, iface)
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
            nic_unit = (root / "etc/systemd/system/swml-nic.service").read_text()
            assert f"ExecStart=/bin/bash {VAGRANT}/tune-nic.sh" in nic_unit

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
        assert w["switch_ip"] == sw_m["net"]["ip"]   # the address the switch VM was given
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


# --------------------------------------------------------------------------
# vagrant/tune-nic.sh
# --------------------------------------------------------------------------
FAKE_ETHTOOL = r'''#!/bin/sh
# Stand-in ethtool: channels and features kept in $FAKE_STATE, changes logged.
. "$FAKE_STATE"
case "$1" in
  -l) printf 'Channel parameters for %s:\nPre-set maximums:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t%s\n' "$2" "$max"
      printf 'Current hardware settings:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t%s\n' "$now" ;;
  -L) echo "-L $4" >>"$FAKE_STATE.log"; sed -i "s/^now=.*/now=$4/" "$FAKE_STATE" ;;
  -k) printf 'Features for %s:\nrx-gro-hw: %s\nlarge-receive-offload: off [fixed]\ngeneric-receive-offload: %s\n' "$2" "$grohw" "$gro" ;;
  -K) echo "-K $3 $4" >>"$FAKE_STATE.log"
      case $3 in rx-gro-hw) sed -i "s/^grohw=.*/grohw=$4/" "$FAKE_STATE" ;; gro) sed -i "s/^gro=.*/gro=$4/" "$FAKE_STATE" ;; esac ;;
esac
'''


@needs_root
@pytest.mark.parametrize("role, cpus, qmax, qnow, want", [
    ("switch", 2, 4, 2, None),   # 2 in use + a spare TX queue per CPU: already right
    ("switch", 2, 8, 8, 2),
    ("switch", 4, 6, 4, 2),      # too few for 4 + 4: keep a TX queue per CPU
    ("switch", 2, 2, 2, None),   # nothing spare: leave it, say so (locked XDP_TX)
    ("worker", 2, 4, 2, 1),      # AF_XDP binds queue 0: everything must arrive there
    ("worker", 2, 4, 1, None),
])
def test_tune_nic_queue_pairs_and_idempotence(role, cpus, qmax, qnow, want, tmp_path):
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is not installed")
    ns, iface = f"swvt{uuid.uuid4().hex[:6]}", "lab0"
    (tmp_path / "bin").mkdir()
    eth = tmp_path / "bin" / "ethtool"
    eth.write_text(FAKE_ETHTOOL)
    eth.chmod(0o755)
    state = tmp_path / "nic.state"
    state.write_text(f"max={qmax}\nnow={qnow}\ngrohw=on\ngro=on\n")
    envf = tmp_path / "vm.env"
    envf.write_text(f"SWML_ROLE={role}\nSWML_IFACE={iface}\nSWML_MTU=1400\n")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FAKE_STATE": str(state),
           "SWML_ENV_FILE": str(envf), "OMP_NUM_THREADS": str(cpus)}  # nproc honours OMP_NUM_THREADS
    _netns(ns, "10.77.0.100", 24, iface)
    try:
        runs = [subprocess.run(["ip", "netns", "exec", ns, "bash", str(VAGRANT / "tune-nic.sh")],
                               env=env, capture_output=True, text=True, timeout=30) for _ in range(2)]
        link = json.loads(subprocess.run(["ip", "-n", ns, "-j", "-d", "link", "show", iface],
                                         capture_output=True, text=True, check=True).stdout)[0]
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    for r in runs:
        assert r.returncode == 0, r.stdout + r.stderr
    log = (tmp_path / "nic.state.log").read_text().splitlines()
    expected = ([f"-L {want}"] if want else []) + ["-K rx-gro-hw off", "-K gro off"]
    assert log == expected, (log, runs[0].stdout)
    assert link["mtu"] == 1400
    assert ("ALLMULTI" in link["flags"]) == (role == "worker")
    # The second run finds everything right and changes nothing.
    assert [x for x in runs[1].stdout.splitlines() if "ready:" not in x and "locked" not in x] == []
    if role == "switch" and qmax < 2 * cpus and want is None:
        assert "locked" in runs[0].stdout


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_vagrant_scripts_pass_shellcheck():
    scripts = [VAGRANT / n for n in ("provision.sh", "tune-nic.sh", "bench.sh", "swml-bench")]
    r = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_vagrant_scripts_parse():
    for n in ("provision.sh", "tune-nic.sh", "bench.sh"):
        subprocess.run(["bash", "-n", str(VAGRANT / n)], check=True)
    subprocess.run(["sh", "-n", str(VAGRANT / "swml-bench")], check=True)
    assert all(os.access(VAGRANT / n, os.X_OK) for n in ("provision.sh", "tune-nic.sh", "bench.sh", "swml-bench"))
