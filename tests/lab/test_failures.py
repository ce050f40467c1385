"""Failures of a worker or of the daemon while a job streams.

Each test has its own lab and switch: they kill things."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

LEASE_S = 2.0


pytestmark = pytest.mark.lab_workers(3)


@pytest.fixture
def lab3(fresh_lab):
    return fresh_lab


def bench_procs(lab, job, world, iterations=100000, size="4MiB"):
    argv = [sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch", lab.switch.ip,
            "--job", job, "--world", str(world), "--size", size, "--iterations", str(iterations),
            "--warmup", "0", "--dtype", "int32", "--backend", "udp", "--quiet", "--json"]
    return [lab.popen(h, argv + ["--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      text=True) for r, h in enumerate(lab.workers[:world])]


def wait_streaming(sw, job, timeout=30.0):
    """Until the job is running and its packets are flowing."""
    from switchml_xdp.switch.maps import SwitchMaps
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = json.loads(subprocess.run([sys.executable, "-m", "switchml_xdp.cli.switch", "status",
                                        "--json"], capture_output=True, text=True).stdout)
        mine = [s for s in st["switches"] if s["iface"] == sw.iface]
        if mine and any(j["name"] == job and j["state"] == "running" for j in mine[0]["jobs"]):
            maps = SwitchMaps(sw.iface)
            c0 = maps.read_counters()["completed"]
            time.sleep(0.3)
            c1 = maps.read_counters()["completed"]
            maps.close()
            if c1 > c0:
                return
        time.sleep(0.1)
    raise AssertionError(f"job {job} never streamed")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_failed_worker_aborts_the_job_on_every_other_worker(lab3, how):
    """SIGKILL closes the worker's control connection: the job is aborted at
    once. SIGSTOP leaves it open but silent: the lease expires."""
    with SwitchProcess(lab3, ["--lease", str(LEASE_S)]) as sw:
        procs = bench_procs(lab3, "victim", 3)
        try:
            wait_streaming(sw, "victim")
            t_fail = time.monotonic()
            procs[1].send_signal(getattr(signal, how))
            for r in (0, 2):
                _, err = procs[r].communicate(timeout=30)
                took = time.monotonic() - t_fail
                assert procs[r].returncode == 1
                assert "rank 1 (10.0.0.12)" in err, err
                assert ("disconnected" if how == "SIGKILL" else "stopped heartbeating") in err, err
                # documented bound (docs/protocol.md): at once / lease + one check period
                assert took < (2.0 if how == "SIGKILL" else LEASE_S + 2.0), took
                print(f"[reliability] worker {how}: rank {r} failed after {took * 1000:.0f} ms")
        finally:
            for p in procs:
                p.kill()
                p.communicate()
        status = json.loads(subprocess.run([sys.executable, "-m", "switchml_xdp.cli.switch",
                                            "status", "--json"], capture_output=True, text=True).stdout)
        mine = next(s for s in status["switches"] if s["iface"] == sw.iface)
        assert mine["jobs"] == [] and mine["active_job_ids"] == [], "slots and job id reclaimed"
        # The same job name again runs exactly.
        t_again = time.monotonic()
        again = bench_procs(lab3, "victim", 3, iterations=2, size="256KiB")
        for p in again:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
        print(f"[reliability] worker {how}: same job name ran again in "
              f"{time.monotonic() - t_again:.2f} s (processes started to exit)")


@pytest.mark.timeout(180)
def test_daemon_killed_mid_tensor_data_plane_goes_on_and_restart_readopts(lab3):
    from switchml_xdp import Worker

    sw = SwitchProcess(lab3, ["--lease", str(LEASE_S)])
    n = 8_000_000  # 31250 packets a rank: seconds of streaming
    killed_at = {}
    restarted = {}

    def rank_body(rank, host):
        with Worker(lab3.switch.ip, "survivor", rank, 2, backend="udp", verbose=False) as w:
            a = np.full(n, rank + 1, dtype=np.int32)
            w.allreduce(a)  # the daemon dies during this call
            done_at = time.monotonic()
            assert np.all(a == 3)
            # Past the lease: only a resumed membership keeps the job alive.
            while "sw" not in restarted:
                time.sleep(0.05)
            time.sleep(LEASE_S * 2)
            b = np.arange(1000, dtype=np.int32)
            w.allreduce(b)
            np.testing.assert_array_equal(b, 2 * np.arange(1000))
            return done_at, w._control.resumed

    def killer():
        from switchml_xdp.switch.maps import SwitchMaps
        maps = SwitchMaps(sw.iface)
        while maps.read_counters()["completed"] < 500:  # streaming, far from done
            time.sleep(0.01)
        maps.close()
        sw.proc.kill()
        killed_at["t"] = time.monotonic()
        sw.proc.wait()
        time.sleep(0.5)
        restarted["sw"] = SwitchProcess(lab3, ["--lease", str(LEASE_S)])

    results = run_ranks(lab3, lab3.workers[:2], rank_body, timeout=150, beside=killer)
    new = restarted["sw"]
    try:
        assert any("re-adopted 1 running job" in line for line in new.output), new.output
        for done_at, resumed in results:
            assert done_at > killed_at["t"], "the tensor must still have been streaming"
            assert resumed >= 1
        after_kill = max(d for d, _ in results) - killed_at["t"]
        print(f"[reliability] daemon SIGKILL: tensor completed {after_kill:.2f} s "
              f"after the kill with no daemon; restarted daemon up in {new.startup_s:.2f} s")
    finally:
        new.stop()
