"""The raw path's ceiling in `swml-lab bench`: for every lab and k, before
the switch goes up and again after it went down, the reflector (reflector.py)
on the switch's port and every worker's raw ping-pong (raw_path.py) at once,
as every worker streams at once in the swml runs. The better of the two is the
ceiling (a busy moment lowers a measurement, nothing raises it); each swml row
of that lab and k gets its packets a second as a fraction of it
(docs/performance.md, "The path's ceiling")."""
from __future__ import annotations

import json
import statistics
import sys

from .raw_path import DEFAULT_WARMUP, fraction, swml_pps

RAW_SECONDS = 1.0
SETUP_TIMEOUT_S = 120        # for every worker's set-up (a bcc compile each)
# The systems whose frames are the raw path's (74 + 4k bytes; not the 16-bit format's).
SWML_SYSTEMS = ("swml-afxdp", "swml-udp", "userspace")


def measure_lab(lab, k: int, window: int, seconds: float = RAW_SECONDS) -> dict:
    """Every worker's raw pps through the reflector on box 0's port; the
    median over workers is the lab's; overlap, the share of the run when all
    of them ran. RuntimeError with a one-line reason."""
    from .reflector import Reflector, ReflectorError

    sw = lab.switch
    argv = [sys.executable, "-m", "switchml_xdp.bench.raw_path", "--switch", sw.ip, "--k", str(k),
            "--window", str(window), "--seconds", str(seconds), "--ready-go"]
    try:
        with Reflector(sw.iface, netns=sw.ns, quiet=True) as r:
            procs = [lab.popen(w, argv, stdin=-1, stdout=-1, stderr=-1, text=True)
                     for w in lab.workers]
            said = _together(procs)
            outs = [(first + out, err) for first, (out, err) in
                    zip(said, (p.communicate(timeout=60 + seconds + DEFAULT_WARMUP)
                               for p in procs))]
            reflected = r.counters()["reflected"]
    except ReflectorError as e:
        raise RuntimeError(str(e)) from None
    per_worker = []
    for w, (out, err) in zip(lab.workers, outs):
        try:
            got = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(f"{w.name}: the raw ping-pong said: {err.strip()[-300:]}") from None
        if "error" in got:
            raise RuntimeError(f"{w.name}: {got['error']}")
        per_worker.append(got)
    pps = [g["pps"] for g in per_worker]
    span = max(g["ended"] for g in per_worker) - min(g["began"] for g in per_worker)
    common = min(g["ended"] for g in per_worker) - max(g["began"] for g in per_worker)
    return {"k": k, "window": window, "frame_len": per_worker[0]["frame_len"],
            "pps": statistics.median(pps), "pps_min": min(pps), "per_worker_pps": pps,
            "gbps": statistics.median(g["gbps"] for g in per_worker),
            "lost": sum(g["lost"] for g in per_worker), "bad": sum(g["bad"] for g in per_worker),
            "overlap": round(max(common, 0.0) / span, 3),
            "reflected": reflected}


def _together(procs) -> list[str]:
    """Wait until every worker is set up ("ready"), then start them all: their
    counted seconds overlap, whatever each one's set-up took. Returns what
    each said before (a worker that failed says why on stdout, then ends)."""
    said = []
    for p in procs:
        lines = []
        while (text := p.stdout.readline()) and text.strip() != "ready":
            lines.append(text)
        said.append("".join(lines))
    for p in procs:
        if p.poll() is None:
            p.stdin.write("go\n")
            p.stdin.flush()
    return said


def line(raw: dict, workers: int) -> str:
    """What the bench prints once it measured."""
    return (f"  raw path (reflector, {workers} worker{'s' if workers > 1 else ''} at once, "
            f"k={raw['k']}, {raw['window']} in flight): {raw['pps'] / 1e3:.1f} kpps a worker, "
            f"{raw['gbps']:.3f} Gbit/s of {raw['frame_len']}-byte frames")


def annotate(results: list[dict], raw: dict, workers: int, k: int, boxes: int = 1) -> list[dict]:
    """Give the swml rows of (workers, k, boxes) their pps and its fraction of
    raw's; returns them."""
    rows = []
    for r in results:
        if (r["system"] in SWML_SYSTEMS and r["workers"] == workers and r["k"] == k
                and r.get("boxes", 1) == boxes and r["status"] == "ok"):
            r["pps"] = swml_pps(r["size_bytes"] // 4, k, r["job_slots"], r["tat_median_s"])
            r["raw_pps"] = raw["pps"]
            r["raw_pps_fraction"] = round(fraction(r["pps"], raw["pps"]), 4)
            rows.append(r)
    return rows


def single_queue_reason(link_queues: int) -> str | None:
    """Why the raw path is not measured on a lab whose links have several
    queues (None where they have one): it is one socket's ceiling, on one
    queue, and the ranks there may stream over all of them in lanes."""
    if link_queues > 1:
        return (f"it is one queue's ceiling, and the lab's links have {link_queues} "
                f"(--link-queues)")
    return None


def around(bench, lab, k: int) -> None:
    """bench._swml_systems(lab, k) (lab_bench.py) with the raw path measured
    first, where it can be (one port on the box, the engine built), and its
    fraction given to the rows after."""
    cfg, n = bench.cfg, len(lab.workers)
    wanted = cfg.ports == 1 and any(s in cfg.systems for s in SWML_SYSTEMS)
    if wanted and lab.link_queues > 1:
        bench.out(f"  raw path: not measured: {single_queue_reason(lab.link_queues)}")
        wanted = False

    def measured() -> dict | None:
        try:
            raw = measure_lab(lab, k, bench.job_slots(k))
        except RuntimeError as e:
            bench.out(f"  raw path: not measured: {e}")
            return None
        bench.out(line(raw, n))
        return raw

    before = measured() if wanted else None
    bench._swml_systems(lab, k)
    after = measured() if before else None
    raw = max(before, after or before, key=lambda r: r["pps"]) if before else None
    if raw:
        raw["pps_before_after"] = [before["pps"], after["pps"] if after else None]
        for r in annotate(bench.results, raw, n, k, bench.boxes):
            bench.out(f"  {r['system']:<12} N={n} k={k} loss={r['loss'] * 100:g}%: "
                      f"{r['pps'] / 1e3:.1f} kpps = {100 * r['raw_pps_fraction']:.1f}% of the "
                      "raw path's")
