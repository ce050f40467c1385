"""The lab: real network namespaces, veths, a bridge and XDP programs (needs root).

Each test removes its own labs by prefix at the end; labs left by an earlier,
killed run are removed only if their owner is dead (orphans_only), so tests
running concurrently in other sessions keep theirs.
"""
from __future__ import annotations

import ast
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(f"lab tests: {NO_LAB}", allow_module_level=True)

from click.testing import CliRunner

from repo import REPO
from switchml_xdp.cli.lab import main as lab_cli
from switchml_xdp.lab import Lab, LabError, cleanup_leftovers
from switchml_xdp.lab.addressing import new_prefix
from switchml_xdp.lab.lifecycle import lab_namespaces, state_path

GROUP, PORT = "239.77.0.1", 48864
needs_ping = pytest.mark.skipif(shutil.which("ping") is None,
                                reason="ping not installed (Debian package iputils-ping)")


def netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout


def assert_gone(prefix: str) -> None:
    assert prefix not in netns_list()
    assert not lab_namespaces(prefix)
    assert not state_path(prefix).exists()


@pytest.fixture(scope="module", autouse=True)
def _tidy():
    """Before: remove orphans of killed runs. After: whatever these tests made."""
    cleanup_leftovers(orphans_only=True)
    made: list[str] = []
    yield made
    for prefix in made:
        cleanup_leftovers(prefix)


@pytest.fixture
def prefix(_tidy) -> str:
    """A fresh prefix, removed after the test whatever happened."""
    p = new_prefix()
    _tidy.append(p)
    return p


@pytest.fixture(scope="module")
def lab2(_tidy):
    lab = Lab(workers=2)
    _tidy.append(lab.prefix)
    with lab:
        yield lab


def ns_inode(ns: str) -> int:
    return os.stat(f"/run/netns/{ns}").st_ino


def thread_ns_inode() -> int:
    return os.stat("/proc/thread-self/ns/net").st_ino


# ------------------------------------------------------------------ topology

@needs_ping
def test_two_worker_lab_pings_and_leaves_nothing(prefix):
    with Lab(workers=2, prefix=prefix) as lab:
        assert sorted(lab_namespaces(prefix)) == sorted(lab.namespaces)
        for w in lab.workers:
            lab.run(lab.switch, ["ping", "-c1", "-W1", w.ip])
            lab.run(w, ["ping", "-c1", "-W1", lab.switch.ip])
    assert_gone(prefix)


def test_pass_program_on_bridge_side_ends_only(lab2):
    for h in lab2.hosts:
        out = subprocess.run(["ip", "-n", lab2.bridge_ns, "link", "show", "dev", h.peer],
                             capture_output=True, text=True, check=True).stdout
        assert " xdp " in out and "swml_pass" in out, out        # " xdp " = native mode
        host_side = lab2.run(h, ["ip", "link", "show", "dev", h.iface]).stdout
        assert "xdp" not in host_side, host_side


def test_hosts_addresses_and_quiet_namespaces(lab2):
    assert [w.ip for w in lab2.workers] == ["10.0.0.11", "10.0.0.12"]
    assert lab2.switch.mac == "02:5d:00:00:00:01"
    assert lab2.workers[1].mac == "02:5d:00:00:01:01"
    for h in lab2.hosts:
        assert len(h.iface) <= 15 and len(h.peer) <= 15
        link = lab2.run(h, ["ip", "-o", "addr", "show", "dev", h.iface]).stdout
        assert f"inet {h.ip}/24" in link and "inet6" not in link
        assert lab2.run(h, ["cat", "/proc/sys/net/ipv6/conf/all/disable_ipv6"]).stdout.strip() == "1"


def test_bridge_port_macs(lab2):
    """Bridge-side ends are 02:5d:00:01:<group>:<index>: group 0 the switch, 1 the workers."""
    want = {lab2.switch.peer: "02:5d:00:01:00:01", lab2.workers[1].peer: "02:5d:00:01:01:01"}
    for peer, mac in want.items():
        out = subprocess.run(["ip", "-n", lab2.bridge_ns, "link", "show", "dev", peer],
                             capture_output=True, text=True, check=True).stdout
        assert f"link/ether {mac} " in out, out


def test_the_lab_reaches_the_kernel_only_through_the_door():
    """No lab module imports bcc (compiling, attaching and pinning go through
    switchml_xdp.bpf), and importing the lab and its CLI loads no bcc, so
    `swml-lab down` works without it."""
    for path in sorted((REPO / "switchml_xdp" / "lab").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "bcc" for n in names), path.name
    code = "import sys, switchml_xdp.lab, switchml_xdp.cli.lab; print('bcc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_multicast_crosses_the_bridge(lab2):
    ready = threading.Barrier(len(lab2.workers) + 1)
    got: dict[str, bytes] = {}

    def receive(w):
        with lab2.enter(w):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", PORT))
            s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                         socket.inet_aton(GROUP) + socket.inet_aton(w.ip))
            s.settimeout(3)
            ready.wait()
            got[w.name] = s.recv(100)

    threads = [threading.Thread(target=receive, args=(w,)) for w in lab2.workers]
    for t in threads:
        t.start()
    ready.wait(timeout=5)
    with lab2.enter(lab2.switch):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with tx:
        tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(lab2.switch.ip))
        deadline = time.monotonic() + 3
        # Resend until everyone has it: a join may still be settling on a slow box.
        while len(got) < len(lab2.workers) and time.monotonic() < deadline:
            tx.sendto(b"result", (GROUP, PORT))
            time.sleep(0.1)
    for t in threads:
        t.join()
    assert got == {w.name: b"result" for w in lab2.workers}


def test_enter_moves_only_the_calling_thread(lab2):
    home = thread_ns_inode()
    inside = threading.Barrier(3)
    seen: dict[str, tuple[int, int]] = {}

    def visit(w):
        before = thread_ns_inode()
        with lab2.enter(w):
            inside.wait(timeout=5)           # both threads are inside at once
            seen[w.name] = (thread_ns_inode(), before)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.bind((w.ip, 0))            # only possible where w.ip is local
            inside.wait(timeout=5)
        assert thread_ns_inode() == before

    threads = [threading.Thread(target=visit, args=(w,)) for w in lab2.workers]
    for t in threads:
        t.start()
    inside.wait(timeout=5)
    assert thread_ns_inode() == home         # the main thread never moved
    inside.wait(timeout=5)
    for t in threads:
        t.join()
    for w in lab2.workers:
        assert seen[w.name] == (ns_inode(w.ns), home)


def test_rate_shapes_both_ends_of_worker_links(prefix):
    with Lab(workers=1, prefix=prefix, rate_mbit=100) as lab:
        w = lab.workers[0]
        up = lab.run(w, ["tc", "qdisc", "show", "dev", w.iface]).stdout
        down = subprocess.run(["tc", "-n", lab.bridge_ns, "qdisc", "show", "dev", w.peer],
                              capture_output=True, text=True, check=True).stdout
        for out in (up, down):
            assert "tbf" in out and "rate 100Mbit" in out, out
    assert_gone(prefix)


# ------------------------------------------------------------------ cleanup

def test_exception_in_body_leaves_nothing(prefix):
    with pytest.raises(ZeroDivisionError):
        with Lab(workers=1, prefix=prefix):
            assert lab_namespaces(prefix)
            raise ZeroDivisionError("a failure inside the lab")
    assert_gone(prefix)


def test_failed_build_is_undone(prefix, monkeypatch):
    def broken(self):
        raise RuntimeError("injected failure")
    monkeypatch.setattr(Lab, "_attach_pass_program", broken)
    with pytest.raises(RuntimeError, match="injected"):
        with Lab(workers=2, prefix=prefix):
            pass
    assert_gone(prefix)


def test_close_stops_processes_in_the_lab(prefix):
    with Lab(workers=1, prefix=prefix) as lab:
        ours = lab.popen(lab.workers[0], ["sleep", "60"])
        stray = subprocess.Popen(["nsenter", f"--net=/run/netns/{lab.switch.ns}", "sleep", "60"])
        time.sleep(0.2)                      # let nsenter exec into the namespace
    assert ours.wait(timeout=5) is not None
    assert stray.wait(timeout=5) is not None
    assert_gone(prefix)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(LabError, match="too long"):
        Lab(workers=2, prefix="averyverylongx")
    with pytest.raises(LabError, match="letters"):
        Lab(workers=2, prefix="a-b")
    with pytest.raises(LabError, match="workers"):
        Lab(workers=0)


def _spawn_lab(prefix: str) -> subprocess.Popen:
    """A separate Python process that builds a lab, says so, and waits."""
    code = ("import sys, time\nfrom switchml_xdp.lab import Lab\n"
            f"Lab(workers=1, prefix={prefix!r}).start()\nprint('up', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "up"
    return proc


def test_sigterm_removes_the_lab(prefix):
    proc = _spawn_lab(prefix)
    assert lab_namespaces(prefix)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == -signal.SIGTERM
    assert_gone(prefix)


def test_orphans_of_killed_runs_are_found(prefix, lab2):
    proc = _spawn_lab(prefix)
    proc.kill()                              # SIGKILL: no chance to clean up
    proc.wait(timeout=5)
    assert lab_namespaces(prefix)
    removed = cleanup_leftovers(orphans_only=True)
    assert set(lab_namespaces(prefix)) == set()
    assert not set(removed) & set(lab2.namespaces)
    assert sorted(lab_namespaces(lab2.prefix)) == sorted(lab2.namespaces)
    assert_gone(prefix)


# ------------------------------------------------------------------ CLI

def test_cli_up_then_down(prefix):
    runner = CliRunner()
    up = runner.invoke(lab_cli, ["up", "-n", "2", "--prefix", prefix])
    assert up.exit_code == 0, up.output
    assert f"{prefix}-w1" in up.output and "10.0.0.12" in up.output and "nsenter --net=" in up.output
    assert len(lab_namespaces(prefix)) == 4 and state_path(prefix).exists()
    kept = Lab.from_state(prefix)            # another process's handle on it
    w1 = kept.workers[1]
    assert kept.run(w1, ["ip", "-o", "addr", "show", w1.iface]).stdout.count("10.0.0.12")
    down = runner.invoke(lab_cli, ["down", prefix])
    assert down.exit_code == 0, down.output
    assert_gone(prefix)


@pytest.mark.parametrize("argv, message", [
    (["down"], "give either a lab PREFIX or --all"),
    (["down", "swlnonexistent"], "no lab with prefix"),
    (["up", "--prefix", "bad-name"], "may hold only"),
    (["up", "-n", "0"], "Invalid value"),
])
def test_cli_bad_input_is_one_line_error(argv, message):
    result = CliRunner().invoke(lab_cli, argv)
    assert result.exit_code in (1, 2)
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("Error:") and message in last, result.output
