"""The lab as a tool: `swml-lab up --switch` starts the switch and
prints the commands that run a worker in each namespace, `swml-lab exec`
runs them, `down --all` removes only the caller's unused labs, and every bad
argument of `demo` (and `up --switch`) fails before anything is built."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from clis import LAB_CLI
from requires import needs_lab
from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.lab import Lab, lifecycle, netns
from switchml_xdp.lab.addressing import new_prefix


def _lab(prefix: str, uid: int, monkeypatch) -> Lab:
    """A lab left up (as `swml-lab up` leaves one) made by user `uid` (through sudo)."""
    monkeypatch.setenv("SUDO_UID", str(uid))
    return Lab(workers=1, prefix=prefix, keep=True).start()


@needs_lab
def test_down_all_leaves_other_users_and_labs_in_use_alone(monkeypatch):
    me, other = 40000 + os.getpid() % 20000, 39999
    mine, theirs, busy = (new_prefix() for _ in range(3))
    labs = []
    try:
        labs.append(_lab(mine, me, monkeypatch))
        labs.append(_lab(theirs, other, monkeypatch))
        monkeypatch.setenv("SUDO_UID", str(me))
        in_use = Lab(workers=1, prefix=busy).start()   # this process uses it (a demo, a test)
        labs.append(in_use)
        assert lifecycle.read_state(mine)["owner_uid"] == me

        r = CliRunner().invoke(lab_cli.main, ["down", "--all"])
        assert r.exit_code == 0, r.output
        assert not lifecycle.lab_namespaces(mine) and not lifecycle.state_path(mine).exists()
        assert sorted(lifecycle.lab_namespaces(theirs)) == sorted(labs[1].namespaces)
        assert sorted(lifecycle.lab_namespaces(busy)) == sorted(in_use.namespaces)
        assert f"left lab {theirs} alone: it belongs to" in r.output
        assert f"left lab {busy} alone: process {os.getpid()} is using it" in r.output
        # By name it goes, whoever made it.
        r = CliRunner().invoke(lab_cli.main, ["down", theirs])
        assert r.exit_code == 0 and not lifecycle.lab_namespaces(theirs), r.output
    finally:
        for lab in labs:
            lab.close()


@needs_lab
def test_up_with_switch_prints_worker_commands_that_work():
    prefix = new_prefix()
    env = {k: v for k, v in os.environ.items() if k != "SUDO_UID"}
    try:
        r = subprocess.run(LAB_CLI + ["up", "-n", "2", "--prefix", prefix, "--switch",
                                      "--switch-args", "-k 64"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "switch: up on" in r.stdout and "k=64" in r.stdout
        state = lifecycle.read_state(prefix)
        daemon_pid = state["switch_daemon"]["pid"]
        os.kill(daemon_pid, 0)   # running, detached from `swml-lab up`, which has exited
        commands = [line.strip() for line in r.stdout.splitlines()
                    if " exec " in line and "swml-worker bench" in line]
        assert len(commands) == 2
        procs = []
        for rank, cmd in enumerate(commands):
            argv = shlex.split(cmd) + ["--size", "256KiB", "-n", "2", "--json", "--verify",
                                       "--backend", "udp"]
            assert f"{prefix}-w{rank}" in argv and f"--rank {rank} --world 2" in cmd
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env={**env, "SWML_TOKEN": "t0ps3cret"}))
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            row = json.loads(out.strip().splitlines()[-1])
            assert row["verify_failures"] == 0 and row["world"] == 2
            assert "waiting for the other 1 rank to join job 'j1'" in err

        status = subprocess.run(LAB_CLI + ["exec", f"{prefix}-sw", "--", sys.executable, "-m",
                                           "switchml_xdp.cli.switch", "status", "--json",
                                           "--interval", "0"],
                                capture_output=True, text=True, timeout=60, env=env)
        assert status.returncode == 0, status.stderr
        sw = next(s for s in json.loads(status.stdout)["switches"] if s["iface"] == f"{prefix}-s")
        assert sw["alive"] and sw["counters"]["completed"] > 0

        down = subprocess.run(LAB_CLI + ["down", prefix], capture_output=True, text=True,
                              timeout=60, env=env)
        assert down.returncode == 0, down.stderr
        assert not lifecycle.lab_namespaces(prefix)
        assert not lifecycle.switch_log_path(prefix).exists()
        assert not netns._alive(daemon_pid)   # (gone, or a zombie that PID 1 has not reaped)
    finally:
        lifecycle.cleanup_leftovers(prefix)


@needs_lab
def test_exec_refuses_what_is_not_a_lab_host():
    r = CliRunner().invoke(lab_cli.main, ["exec", "nosuchlab-w0", "--", "true"])
    assert r.exit_code == 1 and "Error:" in r.output and "Traceback" not in r.output


@needs_lab
@pytest.mark.lab_workers(3)
def test_a_waiting_rank_says_which_ranks_it_waits_for(fresh_lab):
    import time

    from switchml_xdp.lab.cluster import SwitchProcess

    lab = fresh_lab
    with SwitchProcess(lab):
        procs = []
        for rank, host in enumerate(lab.workers):
            argv = [sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch",
                    lab.switch.ip, "--job", "late", "--rank", str(rank), "--world", "3",
                    "--size", "64KiB", "-n", "1", "--warmup", "0", "--backend", "udp", "--json"]
            procs.append(lab.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True))
            time.sleep(2.5)
        errs = []
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            errs.append(err)
    assert "waiting for the other 2 ranks to join job 'late'" in errs[0]
    assert "job 'late': 1/3 ranks joined; waiting for ranks 1, 2" in errs[0], errs[0]
    assert "job 'late': 2/3 ranks joined; waiting for rank 2" in errs[0], errs[0]
