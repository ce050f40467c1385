"""The path's ceiling in the lab: the reflector (xdp/swml_reflect.c) in the
switch's place, and the raw AF_XDP ping-pong (worker/raw_path.c) through it:
every frame comes back intact, the counts add up, the rest of the box's
traffic passes, and `swml-worker bench --baseline raw` prints swml's share of
it (docs/performance.md, "The path's ceiling")."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("switchml_xdp._engine", reason="the AF_XDP engine is not built")

from requires import needs_lab

pytestmark = needs_lab


def _raw(lab, *args: str) -> dict:
    out = lab.run(lab.workers[0], [sys.executable, "-m", "switchml_xdp.bench.raw_path",
                                   "--switch", lab.switch.ip, *args], check=False)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("k", [64, 256])
def test_frames_come_back_intact_and_the_counts_add_up(fresh_lab, k):
    from switchml_xdp.bench.reflector import Reflector

    sw = fresh_lab.switch
    with Reflector(sw.iface, netns=sw.ns) as r:
        got = _raw(fresh_lab, "--k", str(k), "--window", "32", "--seconds", "0.3",
                   "--warmup", "0.05")
        reflected = r.counters()["reflected"]
        ping = fresh_lab.run(fresh_lab.workers[0], ["ping", "-c1", "-W2", sw.ip], check=False)
    assert "error" not in got, got["error"]
    assert got["frame_len"] == wire_len(k)
    assert got["bad"] == 0, got                              # every echo the frame sent
    assert got["echoed"] > 1000, got                         # a veth moves far more in 0.3 s
    # At most the window in flight at either end of the counted part; a veth
    # loses nothing, so a frame given up as lost (a loaded machine held its
    # echo over 50 ms) came back late.
    assert abs(got["sent"] - got["echoed"] - got["lost"]) <= 32, got
    assert got["lost"] <= got["late"] + 32, got
    assert reflected >= got["echoed"]                          # warm-up's frames too
    assert 0.25 < got["seconds"] < 2, got
    assert got["pps"] == pytest.approx(got["echoed"] / got["seconds"])
    assert ping.returncode == 0, ping.stdout                  # everything else passes


def wire_len(k: int) -> int:
    from switchml_xdp import wire

    return wire.HEADERS_LEN + 4 * k


def test_without_a_reflector_it_says_so(fresh_lab):
    got = _raw(fresh_lab, "--seconds", "0.1", "--warmup", "0")
    assert "no frame came back" in got["error"] and "swml-switch reflect" in got["error"]


def test_the_reflector_never_displaces_another_program(fresh_lab):
    from switchml_xdp.bench.reflector import Reflector, ReflectorError

    sw = fresh_lab.switch
    with Reflector(sw.iface, netns=sw.ns):
        with pytest.raises(ReflectorError, match="already has an XDP program"):
            Reflector(sw.iface, netns=sw.ns)


def test_bench_baseline_raw_prints_swmls_share_of_the_raw_path(fresh_lab):
    """The switch for the allreduces, then the reflector in its place for the
    raw part, which the worker waits for."""
    from switchml_xdp.lab.cluster import SwitchProcess

    sw = fresh_lab.switch
    switch = SwitchProcess(fresh_lab, ["--elements", "64"])
    bench = fresh_lab.popen(fresh_lab.workers[0], [
        sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch", sw.ip, "--job", "j",
        "--rank", "0", "--world", "1", "--size", "1MiB", "-n", "2", "--warmup", "1",
        "--baseline", "raw", "--json", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    said_first = []
    while not said_first or ("waiting up to" not in said_first[-1] and said_first[-1]):
        said_first.append(bench.stderr.readline())
    assert "swml-switch reflect" in said_first[-1], said_first
    switch.proc.terminate()
    switch.proc.wait(timeout=30)
    reflect = fresh_lab.popen(sw, [sys.executable, "-m", "switchml_xdp.cli.switch", "reflect",
                                   sw.iface], stderr=subprocess.PIPE, text=True)
    try:
        out, err = bench.communicate(timeout=120)
    finally:
        reflect.terminate()
        said = reflect.communicate(timeout=30)[1]
    assert bench.returncode == 0, err
    row = json.loads(out)
    assert row["raw"]["k"] == 64 and row["raw"]["frame_len"] == wire_len(64)
    assert row["raw"]["window"] == row["slots"] and row["raw"]["bad"] == 0
    assert 0 < row["raw_pps_fraction"] < 5, row
    assert "reflecting UDP to port" in said and "reflected" in said, said


@pytest.mark.lab_workers(2)
def test_the_lab_bench_measures_every_worker_at_once(fresh_lab):
    """swml-lab bench's raw path (raw_lab.py): the reflector up for the
    measurement only, both workers counted over the same moment."""
    from switchml_xdp import bpf
    from switchml_xdp.bench import raw_lab

    raw = raw_lab.measure_lab(fresh_lab, 64, 16, seconds=0.3)
    assert len(raw["per_worker_pps"]) == 2 and min(raw["per_worker_pps"]) > 1000, raw
    assert raw["frame_len"] == wire_len(64) and raw["bad"] == 0, raw
    assert raw["overlap"] > 0.8, raw                        # they ran together
    assert raw["reflected"] >= 2 * 1000
    sw = fresh_lab.switch
    assert bpf.attachment(sw.iface, netns=sw.ns).mode is None   # the reflector is gone
