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
- packaging/tune-nic.sh: the queue-pair arithmetic (with a stand-in ethtool) and its
  idempotence on a veth.
"""
from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from vagrant_plan import IS_ROOT, REPO, VAGRANT, make_netns

needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root (set-up, network namespaces)")

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
# packaging/tune-nic.sh
# --------------------------------------------------------------------------
FAKE_ETHTOOL = r'''#!/bin/sh
# Stand-in ethtool: channels and features kept in $FAKE_STATE, changes logged.
. "$FAKE_STATE"
case "$1" in
  -l) printf 'Channel parameters for %s:\nPre-set maximums:\n' "$2"
      printf 'RX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t%s\n' "$max"
      printf 'Current hardware settings:\nRX:\t\tn/a\nTX:\t\tn/a\nOther:\t\tn/a\nCombined:\t%s\n' "$now" ;;
  -L) echo "-L $4" >>"$FAKE_STATE.log"; sed -i "s/^now=.*/now=$4/" "$FAKE_STATE" ;;
  -k) printf 'Features for %s:\nrx-gro-hw: %s\n' "$2" "$grohw"
      printf 'large-receive-offload: off [fixed]\ngeneric-receive-offload: %s\n' "$gro" ;;
  -K) echo "-K $3 $4" >>"$FAKE_STATE.log"
      case $3 in
        rx-gro-hw) sed -i "s/^grohw=.*/grohw=$4/" "$FAKE_STATE" ;;
        gro) sed -i "s/^gro=.*/gro=$4/" "$FAKE_STATE" ;;
      esac ;;
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
    make_netns(ns, "10.77.0.100", 24, iface)
    try:
        runs = [subprocess.run(["ip", "netns", "exec", ns, "bash", str(REPO / "packaging/tune-nic.sh")],
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
