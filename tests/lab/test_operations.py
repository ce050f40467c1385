"""Operating the switch: --version and help on every command line,
clear address errors, README and Makefile in agreement, status with rates
(plain, --json, --watch) for any user through the control port, the
Prometheus endpoint, and the config file of `swml-switch up`."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request

import pytest

from clis import SWITCH_CLI
from requires import needs_lab
from switchml_xdp import wire

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


# ------------------------------------------------------------ command lines


# ------------------------------------------------------------------- rates


# ---------------------------------------------------------------- metrics


# ------------------------------------------------------------- config file


# ------------------------------------------- a real switch, any user, metrics

def _runs_as_nobody() -> str | None:
    r = subprocess.run(NOBODY + [sys.executable, "-c", "import switchml_xdp.cli.switch"],
                       capture_output=True, text=True, cwd="/")
    return None if r.returncode == 0 else f"user nobody cannot run this installation: {r.stderr[-200:]}"


def _free_port(lab) -> int:
    return 9100 + int(lab.prefix[-2:], 16) % 800


@needs_lab
def test_status_and_down_for_any_user_and_the_metrics_endpoint(fresh_lab):
    """A non-root user reads jobs, counters and rates through the control port
    (no traceback), `status --watch` too; `down` says in one line that it needs
    root; the metrics endpoint answers with the counters, the job and its slots."""
    from switchml_xdp.client.control import ControlClient
    from switchml_xdp.lab.cluster import SwitchProcess

    why = _runs_as_nobody()
    if why:
        pytest.skip(why)
    lab = fresh_lab
    port = _free_port(lab)
    with SwitchProcess(lab, ["--metrics", f"127.0.0.1:{port}"]) as sw:
        assert f"metrics http://127.0.0.1:{port}/metrics" in sw.ready_line
        with lab.enter(lab.workers[0]):
            client = ControlClient(lab.switch.ip)
        try:
            with lab.enter(lab.workers[0]):
                client.join("ops", 1, 0, lab.workers[0].ip, wire.DEFAULT_PORT, lab.workers[0].mac,
                            timeout=10)

            def as_nobody(*args, check=True):
                r = lab.run(lab.switch, NOBODY + SWITCH_CLI + list(args), check=False, cwd="/")
                assert "Traceback" not in r.stdout + r.stderr, r.stderr
                assert not check or r.returncode == 0, r.stdout + r.stderr
                return r

            st = json.loads(as_nobody("status", "--json", "--interval", "0.3").stdout)
            mine = next(s for s in st["switches"] if s["iface"] == sw.iface)
            assert mine["alive"] and set(mine["counters"]) == set(wire.COUNTER_NAMES)
            assert [j["name"] for j in mine["jobs"]] == ["ops"]
            assert mine["rates"]["interval_s"] > 0.2 and "rx" in mine["rates"]["counters"]
            job_id = str(mine["jobs"][0]["id"])   # the data plane counts per job
            assert set(mine["job_stats"][job_id]) >= {"packets", "bytes", "results", "shadow_replies"}
            assert set(mine["rates"]["jobs"][job_id]) == {
                "packets_per_s", "gbit_per_s", "completions_per_s", "retransmissions_answered_per_s"}
            text = as_nobody("status", "--interval", "0.2").stdout
            assert "per second over" in text and "ops" in text
            frame = as_nobody("status", "--watch", "--count", "1", "--interval", "0.2").stdout
            assert "ops" in frame and "dropped: reason" in frame and "per second" in frame
            r = as_nobody("down", sw.iface, check=False)
            assert r.returncode == 1
            assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "needs root" in r.stderr

            with lab.enter(lab.switch):
                deadline = time.monotonic() + 10
                while True:
                    try:
                        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                      timeout=5).read().decode()
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
            assert f'swml_packets_total{{iface="{sw.iface}",outcome="rx"}}' in body
            assert f'swml_dropped_packets_total{{iface="{sw.iface}",reason="bad_source"}}' in body
            assert f'swml_jobs{{iface="{sw.iface}",state="running"}} 1.0' in body
            assert re.search(rf'swml_job_members{{iface="{sw.iface}",job="ops",job_id="\d+"}} 1\.0',
                             body)
            assert re.search(rf'swml_slots_in_use{{iface="{sw.iface}"}} [1-9]', body)
            assert re.search(rf'swml_job_packets_total{{iface="{sw.iface}",job="ops",job_id="\d+"}} ',
                             body)

            # A pinned map whose values are not the size this version reads (a
            # switch of another version) is refused, never read into a short buffer.
            import ctypes as ct

            from switchml_xdp.bpf import PinnedMap, PinnedMapError, pin_dir
            from switchml_xdp.layout import ctype
            bigger = ct.c_uint8 * (ct.sizeof(ctype("swml_job")) + 8)
            with pytest.raises(PinnedMapError, match="another version"):
                PinnedMap(f"{pin_dir(sw.iface)}/jobs", bigger)
        finally:
            client.close()
    assert sw.proc.returncode == 0, "\n".join(sw.output[-20:])


# ------------------------------------------------------------ bench results


@needs_lab
def test_a_restart_that_stays_generic_says_why(fresh_lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    crashed = SwitchProcess(fresh_lab, ["--mode", "generic"])
    crashed.proc.kill()
    crashed.proc.wait()
    with SwitchProcess(fresh_lab) as again:
        assert "generic XDP" in again.ready_line
        assert any("taking over the previous switch, in its generic XDP mode" in line
                   for line in again.output), again.output
