"""Jobs run in the session's lab (8 workers, the switch at k=256): workers as
threads or processes in the worker namespaces, the worker CLI on two ranks,
and an idle rank that holds a job open."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clis import WORKER_CLI

K = 256  # the session switch's k


def skip_without_afxdp(backends) -> None:
    if "afxdp" in backends:
        from switchml_xdp.client import afxdp_backend

        reason = afxdp_backend.unavailable_reason()
        if reason:
            pytest.skip(f"afxdp: {reason}")


def run_job(lab, job: str, backends, body, timeout=120.0, switch_ip=None):
    """body(rank, worker) on every rank at once, a Worker each on backends[rank]."""
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    world = len(backends)

    def rank_body(rank, host):
        with Worker(switch_ip or lab.switch.ip, job, rank, world, backend=backends[rank],
                    verbose=False, stall_timeout=30) as w:
            assert w.backend_name == backends[rank]
            return body(rank, w)

    return run_ranks(lab, lab.workers[:world], rank_body, timeout=timeout)


def bench_cli_2_ranks(lab, job: str, port: int, *extra: str) -> list[dict]:
    """`swml-worker bench --verify --json` of 100 KiB on udp at world 2 (3
    calls): each rank's JSON, after it exited 0."""
    argv = WORKER_CLI + ["bench", "--switch", lab.switch.ip, "--job", job, "--world", "2",
                         "--size", "100KiB", "--iterations", "2", "--warmup", "1", "--verify",
                         "--json", "--backend", "udp", "--port", str(port), *extra]
    procs = [lab.popen(h, argv + ["--rank", str(r)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True) for r, h in enumerate(lab.workers[:2])]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    return results


def start_idle_rank(lab, host, job: str, rank: int, world: int) -> subprocess.Popen:
    """A rank in its own process that joins and then never sends a packet."""
    code = ("import time\n"
            "from switchml_xdp import Worker\n"
            f"w = Worker({lab.switch.ip!r}, {job!r}, {rank}, {world}, backend='udp', verbose=False)\n"
            "print('joined', flush=True)\n"
            "time.sleep(600)\n")
    return lab.popen(host, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)




def rank_results(lab, placements, deadline_s: float, env: dict | None = None) -> list[dict]:
    """Rank processes (a test file run as a script, one per (host, argv)) in the
    lab, all at once; each prints one RESULT line: those, in rank order. The
    ranks import tests/support/ as pytest does; a rank that fails or prints no
    result fails the test with every failing rank's stderr."""
    from switchml_xdp.lab.cluster import RanksFailed, rank_result, run_rank_processes

    support = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (support, os.environ.get("PYTHONPATH")) if p)
    try:
        outs = run_rank_processes(lab, placements, deadline_s, {**(env or {}), "PYTHONPATH": path})
    except RanksFailed as e:
        pytest.fail(str(e))
    results = [rank_result(out) for out, _ in outs]
    assert all(results), "a rank printed no result"
    return results


@contextlib.contextmanager
def xdp_and_userspace_boxes(lab, xdp_args=(), userspace_args=()):
    """The daemon on both boxes of a two-box lab: box 0 with the XDP data
    plane, box 1 with the user-space one; (xdp, userspace) SwitchProcesses."""
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(lab, list(xdp_args), box=0) as xdp, \
            SwitchProcess(lab, ["--dataplane", "userspace", *userspace_args], box=1) as userspace:
        yield xdp, userspace


def tcp_stream(lab, port: int, nbytes: int, timeout: float = 60.0) -> list[int]:
    """`nbytes` over TCP from worker 0 to worker 1 at `port` (Gloo's path
    through the lab); what each end counted: [sent, received]."""
    from switchml_xdp.lab.cluster import run_ranks

    server_ip = lab.workers[1].ip

    def body(rank, host):
        if rank == 1:
            with socket.socket() as srv:
                srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                srv.bind((server_ip, port))
                srv.listen(1)
                srv.settimeout(timeout)
                conn, _ = srv.accept()
                got = 0
                with conn:
                    while chunk := conn.recv(1 << 20):
                        got += len(chunk)
                return got
        for _ in range(200):             # until the peer listens
            try:
                c = socket.create_connection((server_ip, port), timeout=1)
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError("the peer never listened")
        with c:
            c.sendall(b"\x5a" * nbytes)
        return nbytes

    return run_ranks(lab, lab.workers[:2], body, timeout=2 * timeout)
