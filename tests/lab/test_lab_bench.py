"""`swml-lab bench` and what it stands on: the lab's shaping layout, the
user-space switch, the TCP loss dropper, and a smoke run of the whole bench
(tiny tensor, 2 workers, one iteration) that must write JSON, Markdown and PNGs.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from frames import endpoint, udp_frame
from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from crafted_packets import qdisc_bypass_socket
from switchml_xdp import wire
from switchml_xdp.bench import lab_bench
from switchml_xdp.lab import Lab
from switchml_xdp.lab.cluster import run_ranks

SO_RCVBUFFORCE = 33
RATE = 40.0                      # Mbit/s: slow enough to measure from Python


def _torch_missing() -> str | None:
    try:
        import torch  # noqa: F401 - imported only to learn whether it is there
    except ImportError as e:
        return (f"torch is not installed ({e}); `pip install -e '.[torch]'` "
                "(or scripts/setup.sh --torch) adds the Gloo peer")
    return None


def _tc_packets(argv: list[str]) -> int:
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return int(out.split(" pkt", 1)[0].rsplit(" ", 1)[1])


def _receive(lab, host, port: int, out: dict) -> None:
    """Count bytes (Ethernet frame sizes) arriving at host:port until 0.5 s of silence."""
    with lab.enter(host):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 32 << 20)
        s.bind(("0.0.0.0", port))
        s.settimeout(0.5)
        first = last = None
        nbytes = 0
        try:
            while True:
                d = s.recv(4096)
                now = time.monotonic()
                first = first or now
                last = now
                nbytes += len(d) + 42
        except TimeoutError:
            pass
    out[port] = nbytes * 8 / (last - first) / 1e6 if first and last > first else 0.0


def _bypass_flood(lab, src, dst, dport: int, frames: int) -> None:
    """What an AF_XDP socket in copy mode does: frames handed to the driver past
    the qdisc (AF_PACKET with PACKET_QDISC_BYPASS takes the same path)."""
    with qdisc_bypass_socket(lab, src) as raw:
        frame = udp_frame(endpoint(src, 40000), endpoint(dst, dport), b"x" * 1000)
        for _ in range(frames):
            try:
                raw.send(frame)
            except OSError:
                pass


@pytest.fixture(scope="module")
def shaped_lab():
    with Lab(workers=2, rate_mbit=RATE) as lab:
        yield lab


def test_shaping_layout(shaped_lab):
    lab = shaped_lab
    ns = ["tc", "-n", lab.bridge_ns]
    for w in lab.workers:
        assert f"rate {RATE:g}Mbit" in lab.run(w, ["tc", "qdisc", "show", "dev", w.iface]).stdout
        out = subprocess.run(ns + ["qdisc", "show", "dev", w.peer], capture_output=True, text=True).stdout
        assert "tbf" in out and f"rate {RATE:g}Mbit" in out, out
    classes = subprocess.run(ns + ["class", "show", "dev", lab.switch.peer],
                             capture_output=True, text=True).stdout
    assert classes.count(f"rate {RATE:g}Mbit ceil {RATE:g}Mbit") == len(lab.workers), classes
    filters = subprocess.run(ns + ["filter", "show", "dev", lab.switch.peer],
                             capture_output=True, text=True).stdout
    for w in lab.workers:
        assert socket.inet_aton(w.ip).hex() + "/ffffffff at 12" in filters, filters
    # The switch's own interface is not shaped.
    assert "tbf" not in lab.run(lab.switch, ["tc", "qdisc", "show", "dev", lab.switch.iface]).stdout


def test_frames_past_the_workers_qdisc_are_shaped_per_worker(shaped_lab):
    """The fact the layout rests on: frames that skip the worker's own qdisc
    (AF_XDP copy mode) are not shaped there, yet reach the switch at the link
    rate, each worker on its own, through the switch port's HTB classes."""
    lab = shaped_lab
    w0, w1 = lab.workers
    own_qdisc = ["nsenter", f"--net=/run/netns/{w0.ns}", "tc", "-s", "qdisc", "show", "dev", w0.iface]
    before = _tc_packets(own_qdisc)
    rates: dict = {}
    ports = (47001, 47002)
    rx = [threading.Thread(target=_receive, args=(lab, lab.switch, p, rates)) for p in ports]
    for t in rx:
        t.start()
    time.sleep(0.2)
    # Twice what the link carries in ~1 s, from both workers at once.
    frames = int(2 * RATE * 1e6 / 8 / 1042)
    tx = [threading.Thread(target=_bypass_flood, args=(lab, w, lab.switch, p, frames))
          for w, p in zip((w0, w1), ports)]
    for t in tx:
        t.start()
    for t in tx + rx:
        t.join()
    assert _tc_packets(own_qdisc) - before < 50      # (a few ARP/IGMP frames at most)
    for p in ports:
        assert 0.8 * RATE < rates[p] < 1.15 * RATE, rates


def test_userspace_switch_reduces_exactly_and_answers_retransmissions(shaped_lab):
    """The user-space switch (every thread at the bench's niceness) speaks the
    protocol: int32 sums exact, a retransmission to a completed slot gets a
    unicast shadow reply."""
    from switchml_xdp import Worker
    from switchml_xdp.bench.lab_switch import USERSPACE_NICE, userspace_switch

    lab = shaped_lab
    rng = np.random.default_rng(5)
    inputs = [rng.integers(-2**31, 2**31, size=3 * 256 + 5, dtype=np.int64).astype(np.int32)
              for _ in lab.workers]
    with userspace_switch(lab, ["--elements", "256", "--lease", "2"]) as sw:
        assert "user-space process" in sw.ready_line
        tids = os.listdir(f"/proc/{sw.proc.pid}/task")
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tids} == {USERSPACE_NICE}

        def body(rank, host):
            with Worker(lab.switch.ip, "us-exact", rank, 2, backend="udp", verbose=False) as w:
                a = inputs[rank].copy()
                w.allreduce(a)
                return a

        outs = run_ranks(lab, lab.workers, body)
        expect = np.sum(np.stack(inputs).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)
        for a in outs:
            np.testing.assert_array_equal(a, expect)

        # A retransmission of rank 0's last packet, after the slot completed.
        from switchml_xdp.client.control import ControlClient

        with lab.enter(lab.workers[0]):
            c0 = ControlClient(lab.switch.ip)
        with lab.enter(lab.workers[1]):
            c1 = ControlClient(lab.switch.ip)
        try:
            infos = [None, None]

            def join(i, c, host):
                infos[i] = c.join("us-shadow", 2, i, host.ip, 47100, host.mac, 10)
            ts = [threading.Thread(target=join, args=(i, c, h))
                  for i, (c, h) in enumerate(zip((c0, c1), lab.workers))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            info = infos[0]
            socks = []
            for h in lab.workers:
                with lab.enter(h):
                    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                s.bind((h.ip, 47100))
                s.settimeout(2)
                socks.append(s)
            vals = np.arange(256, dtype=np.int32)
            for rank, s in enumerate(socks):
                s.sendto(wire.datagram(wire.TYPE_DATA, info.job_id, rank, 0, 7, vals, key=info.key),
                         (lab.switch.ip, wire.DEFAULT_PORT))
            s = socks[0]
            s.sendto(wire.datagram(wire.TYPE_DATA, info.job_id, 0, 0, 7, vals, key=info.key,
                                   flags=wire.FLAG_RETRANS), (lab.switch.ip, wire.DEFAULT_PORT))
            reply = s.recv(2048)        # unicast: the socket joined no group
            h = wire.unpack_header(reply)
            assert h["flags"] & wire.FLAG_SHADOW and h["seq"] == 7
            np.testing.assert_array_equal(np.frombuffer(reply[wire.HDR_LEN:], "<i4"), 2 * vals)
            for s in socks:
                s.close()
        finally:
            c0.close()
            c1.close()


def test_bench_smoke(tmp_path):
    """The whole bench, tiny: every system that can run here runs once, and the
    JSON, the Markdown table and the three plots are written."""
    missing = _torch_missing()
    systems = [s for s in lab_bench.SYSTEMS if not (s == "gloo" and missing)]
    lines: list[str] = []
    cfg = lab_bench.BenchConfig(workers=(2,), rate_mbit=100, size=64 << 10, iterations=1,
                                warmup=0, losses=(0.0,), ks=(64,), systems=systems,
                                out_dir=str(tmp_path), command="pytest smoke")
    doc = lab_bench.run_bench(cfg, out=lines.append)
    for name in ("lab_bench.json", "lab_bench.md", "tat_vs_workers.png", "goodput_vs_bound.png",
                 "tat_vs_loss.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    saved = json.loads((tmp_path / "lab_bench.json").read_text())
    assert saved["meta"]["command"] == "pytest smoke"
    by = {r["system"]: r for r in saved["results"]}
    assert set(by) == set(systems)
    for s in ("swml-udp", "userspace") + (() if missing else ("gloo",)):
        assert by[s]["status"] == "ok", by[s]
        assert by[s]["tat_median_s"] > 0 and by[s]["cpu"]["busy_pct"] >= 0   # (10 ms ticks)
        assert by[s]["rel_err"] < 1e-6, by[s]      # the result is the sum
        assert by[s]["cpu_s_per_gib"]["ranks"] > 0, by[s]   # cpu_per_gib.py
    for s in ("swml-udp", "userspace"):     # the box's CPU over one more call
        assert by[s]["box_calls"] == 1 and by[s]["cpu_s_per_gib"]["box"] > 0, by[s]
    a = by["swml-afxdp"]
    assert a["status"] == "ok" or a["status"].startswith("unavailable"), a
    md = (tmp_path / "lab_bench.md").read_text()
    assert "| N | loss |" in md and "k = 64" in md
    if a["status"] == "ok":   # the raw path's ceiling beside it (raw_lab.py)
        assert a["raw_pps"] > 0 and a["raw_pps_fraction"] > 0 and "% of raw pps" in md, a
    assert doc["results"] == saved["results"]
    # Loss-free only: no loss injector and no TCP dropper on the path (BenchConfig.lossy).
    assert saved["meta"]["loss_hooks"] is False
    assert all("tcp_frames" not in r for r in saved["results"]), saved["results"]
    # The bound is the wire's, and the definition printed with it says so.
    hdrs = wire.HEADERS_LEN
    assert by["swml-udp"]["bound_mbps"] == pytest.approx(100 * 256 / (hdrs + 256), rel=1e-3)
    assert f"({hdrs} + 4k)" in saved["meta"]["definitions"]["bound_swml"]
    assert f"swml {wire.HDR_LEN} bytes" in md
    if missing:
        pytest.skip(f"Gloo part skipped: {missing}")
    assert by["gloo"]["cpu_s_per_gib"]["box"] is None
    assert by["swml-udp"]["cpu_per_gib_vs_gloo"] > 0 and "| CPU swml/gloo |" in md
    assert any(line.startswith("    ranks' CPU s/GiB over Gloo's: ") for line in lines), lines


def test_bench_with_loss_attaches_the_loss_hooks(tmp_path):
    """A sweep with a loss above 0: swml's UDP through the loss injector and
    Gloo's TCP through its dropper, both counted; the 0% row runs beside."""
    missing = _torch_missing()
    systems = ["swml-udp"] + ([] if missing else ["gloo"])
    cfg = lab_bench.BenchConfig(workers=(2,), rate_mbit=100, size=64 << 10, iterations=2,
                                warmup=0, losses=(0.0, 0.05), ks=(64,), systems=systems,
                                out_dir=str(tmp_path), plots=False, command="pytest lossy")
    doc = lab_bench.run_bench(cfg, out=lambda line: None)
    assert doc["meta"]["loss_hooks"] is True
    rows = {(r["system"], r["loss"]): r for r in doc["results"]}
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-6 for r in rows.values()), rows
    assert rows["swml-udp", 0.05]["counters"]["retransmissions"] > 0
    if missing:
        pytest.skip(f"Gloo part skipped: {missing}")
    assert rows["gloo", 0.05]["tcp_dropped"] > 0 and rows["gloo", 0.0]["tcp_dropped"] == 0
