"""The operator's view of shares on a real `swml-switch up --share weighted`
(docs/operations.md, "Setting weights"): `swml-switch job` as root changes
a running job's weight and pins its mark, which `status` (text and JSON)
and the metrics show; a wrong operator token, weights 0, -1, 'x' and above
--max-weight, and an unknown job each get one error line and change
nothing; a user who is not root is told in one line that only root may."""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from clis import SWITCH_CLI
from requires import needs_lab
from switchml_xdp import wire

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
MAX_WEIGHT = 4


def _nobody_cannot_run() -> str | None:
    r = subprocess.run(NOBODY + [sys.executable, "-c", "import switchml_xdp.cli.switch"],
                       capture_output=True, text=True, cwd="/")
    return None if r.returncode == 0 else f"user nobody cannot run this installation: {r.stderr[-200:]}"


@needs_lab
def test_the_operator_sets_a_weight_and_nobody_else_can(fresh_lab, tmp_path):
    from switchml_xdp.client.control import ControlClient
    from switchml_xdp.lab.cluster import SwitchProcess
    from switchml_xdp.switch.state_files import operator_path

    lab = fresh_lab
    metrics_port = 9100 + int(lab.prefix[-2:], 16) % 800
    args = ["--share", "weighted", "--capacity", "100M", "--max-weight", str(MAX_WEIGHT),
            "--metrics", f"127.0.0.1:{metrics_port}"]
    with SwitchProcess(lab, args) as sw:
        def cli(*argv, prefix=(), check=True):
            r = lab.run(lab.switch, [*prefix, *SWITCH_CLI, *argv], check=False, cwd="/")
            assert "Traceback" not in r.stdout + r.stderr, r.stderr
            assert not check or r.returncode == 0, r.stdout + r.stderr
            return r

        def refused(*argv, prefix=()) -> str:
            r = cli("job", *argv, prefix=prefix, check=False)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 1 and r.stdout == "" and len(lines) == 1, r.stderr
            return lines[0]

        def job() -> dict:
            st = json.loads(cli("status", "--json", "--interval", "0").stdout)
            mine = next(s for s in st["switches"] if s["iface"] == sw.iface)
            assert mine["shares"]["policy"] == "weighted", mine.get("shares")
            return next(j for j in mine["jobs"] if j["name"] == "ops")

        def share() -> dict | None:
            return job().get("share")

        with lab.enter(lab.workers[0]):
            client = ControlClient(lab.switch.ip)
        try:
            with lab.enter(lab.workers[0]):
                client.join("ops", 1, 0, lab.workers[0].ip, wire.DEFAULT_PORT,
                            lab.workers[0].mac, timeout=10)
            deadline = time.monotonic() + 5
            while share() is None:   # the share loop sees it at its next round
                assert time.monotonic() < deadline, "the running job never got a share"
                time.sleep(0.05)
            assert share()["weight"] == 1.0

            r = cli("job", "ops", "--weight", "3", "--dscp", "46")
            assert r.stdout == "job ops: weight 3 (was 1), dscp 46 pinned\n", r.stdout
            got = share()
            assert got["weight"] == 3.0 and got["dscp"] == 46 and got["share"] == 1.0, got
            text = cli("status", "--interval", "0").stdout
            assert "share 1.00 (weight 3) target 100.0 Mbit/s" in text, text
            assert "shares weighted of 100 Mbit/s, weights up to 4" in text, text

            wrong = tmp_path / "wrong.operator"
            wrong.write_text("0" * 32 + "\n")
            assert refused("ops", "--weight", "2", "--token-file", str(wrong)).startswith(
                "Error: not the operator's token: only root on the box")
            for bad in ("0", "-1", "x"):
                assert refused("ops", "--weight", bad) == (
                    f"Error: a weight is a number above zero, not {bad!r}")
            assert refused("ops", "--weight", str(MAX_WEIGHT + 1)) == (
                f"Error: weight {MAX_WEIGHT + 1} is above this box's cap of {MAX_WEIGHT} "
                f"(swml-switch up --max-weight)")
            assert refused("nosuch", "--weight", "2") == "Error: no job 'nosuch' on this box"
            if (why := _nobody_cannot_run()) is None:
                assert refused("ops", "--weight", "2", prefix=NOBODY) == (
                    f"Error: only root on the box may change a job's share (cannot read "
                    f"{operator_path(sw.iface)}: Permission denied)")
            got = share()
            assert got["weight"] == 3.0 and got["dscp"] == 46, got

            with lab.enter(lab.switch):
                body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                              timeout=5).read().decode()
            labels = f'iface="{sw.iface}",job="ops",job_id="{job()["id"]}"'
            assert f"swml_job_weight{{{labels}}} 3.0" in body, body
            assert f"swml_job_share{{{labels}}} 1.0" in body, body
            assert f"swml_job_target_bits_per_second{{{labels}}} 1e+08" in body, body
            assert f"swml_job_actual_bits_per_second{{{labels}}}" in body, body
        finally:
            client.close()
    assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])
    if why is not None:
        pytest.skip(f"all but the non-root refusal checked; {why}")

