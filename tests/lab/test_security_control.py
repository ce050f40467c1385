"""docs/security.md, the control plane: whoever reaches the control port
without a job's token cannot change that job, take its ranks or starve it of
slots; one client cannot hold more than its share; a user who is not root
sees `status` (without secrets) and gets one-line refusals, not tracebacks.

Attacks come from a lab host that is no member of the honest job, against the
shared switch (conftest.py), while the honest job reduces int32 tensors whose
sums are checked exactly on every call.
"""
from __future__ import annotations

import itertools
import json
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout

import pytest

from clis import SWITCH_CLI
from control_helpers import LEASE_S, PORT, Raw, assert_error, job_of, join_msg, status, wait_for, wait_members
from honest_job import HonestJob
from switchml_xdp.switch.control import MAX_CONNECTIONS_PER_IP, MAX_PENDING_JOINS_PER_IP

AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
_names = itertools.count()


def job_name(tag: str) -> str:
    return f"sec-{tag}-{next(_names)}"


def test_control_abuse_without_the_token_changes_nothing_for_a_running_job(lab8, switch):
    name, token = job_name("honest"), secrets.token_hex(16)
    h0, h1, evil = lab8.workers[0], lab8.workers[1], lab8.workers[2]
    free = status(lab8)["slots_free"]
    job = HonestJob(lab8, name, token, (h0, h1))
    try:
        wait_members(lab8, name, {0})
        with Raw(lab8, evil) as r:
            # Squat rank 1 at the barrier: refused without the token, or with another.
            assert_error(r.request(join_msg(name, 2, 1, evil, port=PORT)), f"job {name!r} needs its token",
                         op="join")
            assert_error(r.request(join_msg(name, 2, 1, evil, port=PORT, token="guess")),
                         f"wrong token for job {name!r}", op="join")
            assert wait_members(lab8, name, {0})["state"] == "joining"
        job.start_rank1()
        j = wait_for(lambda: (j := job_of(status(lab8), name)) and j["state"] == "running" and j,
                     what="the honest job to run")
        assert j["protected"] and j["members"]["1"]["ip"] == h1.ip
        wait_for(lambda: min(job.calls) >= 2, 20, "the honest job to reduce")

        with Raw(lab8, evil) as r:
            # Resume a rank (on the old switch: the job aborted, blaming the victim).
            for extra, error in (({}, "needs its token"), ({"token": "x" * 32}, "wrong token")):
                msg = {"op": "resume", "job": name, "job_id": j["id"], "rank": 0, **extra}
                assert_error(r.request(msg), f"job {name!r} {error}" if error == "needs its token"
                             else f"wrong token for job {name!r}", op="resume")
            # Leave or heartbeat for another's rank: they name no job or rank (refused at
            # the door), and act on the sender's own membership only.
            for op in ("leave", "heartbeat"):
                assert_error(r.request({"op": op, "job": name, "rank": 0, "token": "x"}),
                             f"unknown field 'job' in {op}", op=op)
                assert_error(r.request({"op": op, "token": "x"}),
                             f"{op} needs a joined job on this connection", op=op)
            # The running job's name: the token is asked first (nothing else is told).
            assert_error(r.request(join_msg(name, 2, 0, evil, port=PORT)), "needs its token", op="join")
            # Hold the slot pool with joins that never complete: no slots are taken,
            # and one source address can keep only so many joins waiting.
            holders = []
            try:
                for i in range(MAX_PENDING_JOINS_PER_IP):
                    c = Raw(lab8, evil)
                    holders.append(c)
                    c.send(join_msg(f"{name}-hold{i}", 2, 0, evil, timeout=60))
                wait_for(lambda: sum(jj["name"].startswith(f"{name}-hold") for jj in status(lab8)["jobs"])
                         == MAX_PENDING_JOINS_PER_IP, what="the squatting joins to wait")
                assert_error(r.request(join_msg(f"{name}-one-more", 2, 0, evil, timeout=60)),
                             f"too many joins from {evil.ip} waiting at barriers "
                             f"(limit {MAX_PENDING_JOINS_PER_IP})", op="join")
                st = status(lab8)
                assert st["slots_free"] == free - j["slots"], "joins that never complete hold no slots"
                # Another team's job starts and finishes meanwhile.
                other, (a, b) = job_name("other"), lab8.workers[3:5]
                with Raw(lab8, a) as ra, Raw(lab8, b) as rb:
                    ra.send(join_msg(other, 2, 0, a, token="t2"))
                    assert rb.request(join_msg(other, 2, 1, b, token="t2"))["ok"]
                    assert ra.recv()["ok"]
            finally:
                for c in holders:
                    c.close()
        st = status(lab8)
        j2 = job_of(st, name)
        assert j2["state"] == "running" and j2["id"] == j["id"] and j2["members"] == j["members"]
    finally:
        job.finish()


def test_a_member_without_its_token_changes_nothing(lab8, switch):
    """Members' own leave/heartbeat need the token too (a connection handed to
    someone else, or a client that lost it)."""
    name, (h0,) = job_name("member"), lab8.workers[:1]
    with Raw(lab8, h0) as r:
        assert r.request(join_msg(name, 1, 0, h0, token="s3cret"))["ok"]
        for op in ("heartbeat", "leave"):
            assert_error(r.request({"op": op}), f"job {name!r} needs its token", op=op)
            assert_error(r.request({"op": op, "token": "nope"}), f"wrong token for job {name!r}", op=op)
        assert job_of(status(lab8), name)["state"] == "running"
        assert r.request({"op": "heartbeat", "token": "s3cret"})["ok"]
        assert r.request({"op": "leave", "token": "s3cret"})["job_ended"]


def test_an_open_job_is_marked_and_takes_no_token_later(lab8, switch):
    name, (h0, h1) = job_name("open"), lab8.workers[:2]
    with Raw(lab8, h0) as r0, Raw(lab8, h1) as r1:
        r0.send(join_msg(name, 2, 0, h0))
        assert wait_members(lab8, name, {0})["protected"] is False
        assert_error(r1.request(join_msg(name, 2, 1, h1, token="late")), "was opened without a token",
                     op="join")
        assert r1.request(join_msg(name, 2, 1, h1))["ok"] and r0.recv()["ok"]
        assert r0.request({"op": "leave"})["ok"] and r1.recv()["event"] == "left"
        assert r1.request({"op": "leave"})["job_ended"]


def test_too_many_connections_from_one_address(lab8, switch):
    host = lab8.workers[5]
    conns = []
    try:
        for _ in range(MAX_CONNECTIONS_PER_IP):
            conns.append(Raw(lab8, host))
        for c in conns[:3]:
            assert c.request({"op": "status"})["ok"]
        with Raw(lab8, host) as extra:
            assert_error(extra.recv(5), f"too many control connections from {host.ip} "
                                        f"(limit {MAX_CONNECTIONS_PER_IP}); closing")
            assert extra.recv(5) is None
        with Raw(lab8, lab8.workers[6]) as other:   # other addresses are served
            assert other.request({"op": "status"})["ok"]
    finally:
        for c in conns:
            c.close()
    wait_for(lambda: Raw(lab8, host).request({"op": "status"})["ok"], what="the address to be served again")


# --- users who are not root ----------------------------------------------------

def _as_nobody(lab, argv, in_switch_ns: bool):
    cmd = AS_NOBODY + argv
    if in_switch_ns:
        return lab.run(lab.switch, cmd, check=False, capture_output=True, text=True, timeout=60)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _while_heartbeating(raw, token: str, run):
    """run() in a thread while `raw` heartbeats its member every half lease."""
    with ThreadPoolExecutor(1) as pool:
        fut = pool.submit(run)
        while True:
            reply = raw.request({"op": "heartbeat", "token": token})
            assert reply.get("ok"), f"heartbeat refused: {reply}"
            try:
                return fut.result(timeout=LEASE_S / 2)
            except FuturesTimeout:
                continue


@pytest.mark.parametrize("in_switch_ns", [True, False], ids=["control-port", "no-route"])
def test_status_as_nobody_shows_jobs_without_secrets(lab8, switch, in_switch_ns):
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode:
        pytest.skip("setpriv (util-linux) is not installed")
    name, token, (h0,) = job_name("nobody"), "tok-" + secrets.token_hex(8), lab8.workers[:1]
    with Raw(lab8, h0) as r:
        assert r.request(join_msg(name, 1, 0, h0, token=token))["ok"]
        # One sample (--interval 0: no rates). The job's lease here is 2 s and
        # the member heartbeats only through this test: keep it alive while a
        # status (a fresh interpreter, seconds on a loaded machine) runs.
        human = _while_heartbeating(r, token, lambda: _as_nobody(
            lab8, SWITCH_CLI + ["status", "--interval", "0"], in_switch_ns))
        js = _while_heartbeating(r, token, lambda: _as_nobody(
            lab8, SWITCH_CLI + ["status", "--json", "--interval", "0"], in_switch_ns))
        assert r.request({"op": "leave", "token": token})["ok"]
    for out in (human, js):
        assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr
        assert token not in out.stdout + out.stderr
    from switchml_xdp.switch.jobs import token_digest
    assert token_digest(token).hex() not in js.stdout
    mine = next(s for s in json.loads(js.stdout)["switches"] if s["iface"] == switch.iface)
    assert job_of(mine, name)["protected"] is True
    assert f"switch {switch.iface}:" in human.stdout and name in human.stdout
    if in_switch_ns:
        assert "counters" in mine and "dropped:" in human.stdout
    else:
        # (status wraps at 80 columns)
        assert "only root can read the pinned maps" in " ".join(human.stdout.split()), human.stdout


def test_down_as_nobody_is_one_line(lab8, switch):
    if subprocess.run(["which", "setpriv"], capture_output=True).returncode:
        pytest.skip("setpriv (util-linux) is not installed")
    r = _as_nobody(lab8, SWITCH_CLI + ["down", switch.iface], in_switch_ns=True)
    assert r.returncode == 1 and r.stderr.strip() == ("Error: swml-switch down needs root (it stops "
                                                      "the daemon, detaches XDP and removes pinned maps)")
    assert switch.proc.poll() is None and status(lab8)["ok"]


def test_state_files_hold_no_secrets_and_tokens_are_root_only(lab8, switch):
    import os

    from switchml_xdp.switch.jobs import token_digest
    from switchml_xdp.switch.state_files import state_path, tokens_path

    name, token, (h0,) = job_name("files"), secrets.token_hex(16), lab8.workers[:1]
    with Raw(lab8, h0) as r:
        assert r.request(join_msg(name, 1, 0, h0, token=token))["ok"]
        public = open(state_path(switch.iface)).read()
        assert token not in public and token_digest(token).hex() not in public
        assert os.stat(state_path(switch.iface)).st_mode & 0o777 == 0o644
        assert os.stat(tokens_path(switch.iface)).st_mode & 0o777 == 0o600
        assert json.load(open(tokens_path(switch.iface)))[name] == token_digest(token).hex()
        assert r.request({"op": "leave", "token": token})["ok"]


@pytest.mark.lab_workers(2)
def test_a_readopted_job_keeps_its_token(fresh_lab):
    """A daemon killed and restarted re-adopts a protected job with its token's
    digest (from the root-only file): its member resumes with the token, a
    stranger's resume is refused."""
    from switchml_xdp.client.control import ControlClient
    from switchml_xdp.lab.cluster import SwitchProcess

    lab = fresh_lab
    (h0, evil), name, token = lab.workers, job_name("readopt"), secrets.token_hex(16)
    sw = SwitchProcess(lab, ["--lease", "3"])
    with lab.enter(h0):   # its reader and heartbeat threads are born in h0's namespace
        c = ControlClient(lab.switch.ip)
        info = c.join(name, 1, 0, h0.ip, PORT, h0.mac, timeout=10, token=token)
    try:
        sw.proc.kill()
        sw.proc.wait()
        sw = SwitchProcess(lab, ["--lease", "3"])
        assert any("re-adopted 1 running job" in line for line in sw.output), sw.output
        with Raw(lab, evil) as r:
            msg = {"op": "resume", "job": name, "job_id": info.job_id, "rank": 0}
            assert_error(r.request(msg), f"job {name!r} needs its token", op="resume")
            assert_error(r.request({**msg, "token": "nope"}), f"wrong token for job {name!r}", op="resume")
        wait_for(lambda: c.resumed >= 1 or c.abort_reason, 10, "the member to resume")
        assert c.abort_reason is None and c.resumed == 1
        j = job_of(status(lab), name)
        assert j["state"] == "running" and j["protected"] is True
        c.leave()
    finally:
        c.close()
        sw.stop()


def test_bench_cli_takes_the_token_from_the_environment_or_the_flag(lab8, switch):
    """`swml-worker bench`: rank 0 with $SWML_TOKEN, rank 1 with --token; a
    rank with another token is refused in one line and the job is undisturbed."""
    import os

    name, token = job_name("cli"), secrets.token_hex(16)
    argv = [sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch", lab8.switch.ip,
            "--job", name, "--world", "2", "--size", "64KiB", "--iterations", "2", "--warmup", "0",
            "--verify", "--json", "--quiet", "--backend", "udp", "--port", "48911"]
    env = {**os.environ, "SWML_TOKEN": token}
    r0 = lab8.popen(lab8.workers[0], argv + ["--rank", "0"], env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
    try:
        wait_members(lab8, name, {0})
        wrong = lab8.run(lab8.workers[2], argv + ["--rank", "1", "--token", "not-it"], check=False,
                         capture_output=True, text=True, timeout=60)
        assert wrong.returncode == 1
        assert wrong.stderr.strip() == f"Error: join refused: wrong token for job {name!r}", wrong.stderr
        r1 = lab8.run(lab8.workers[1], argv + ["--rank", "1", "--token", token], check=False,
                      capture_output=True, text=True, timeout=120)
        assert r1.returncode == 0, r1.stderr
        assert json.loads(r1.stdout)["verify_failures"] == 0
        out, err = r0.communicate(timeout=60)
        assert r0.returncode == 0 and json.loads(out)["verify_failures"] == 0, err
    finally:
        if r0.poll() is None:
            r0.kill()
