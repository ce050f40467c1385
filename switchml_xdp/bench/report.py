"""The report of a `swml-lab bench` run: its figures of merit (summary; what
README.md quotes under "Measured"), the Markdown table, and the line printed
for each result; the PNG plots are lab_plots.py."""
from __future__ import annotations

from ..lab.burst import sweep_heading
from .constants import (
    FOREIGN_WARN_PCT,
    GLOO_SYSTEMS,
    LABELS,
    SYSTEMS,
    boxes_bound_s,
    swml_bound_mbps,
)

SKIPPED = "skipped"   # status of the cells after a failed one of the same rank group


def disturbed(r: dict) -> bool:
    return (r.get("foreign_cpu_pct") or 0) >= FOREIGN_WARN_PCT or bool(r.get("other_netns"))


def boxes_label(boxes: int, rate_mbit: float | None, ports: int = 1) -> str:
    """"2 boxes of 100 Mbit/s", "1 box, 4 ports of 100 Mbit/s": a run's
    boxes (or its box's ports) and their ports' rate."""
    what = f"1 box, {ports} ports" if ports > 1 else f"{boxes} box{'es' if boxes > 1 else ''}"
    return what + (f" of {rate_mbit:g} Mbit/s" if rate_mbit else " unshaped")


def box_counts(meta: dict) -> list[int]:
    """The run's box counts (runs before `--boxes`: one box)."""
    return list(meta.get("boxes") or [1])


def row_line(r: dict) -> str:
    """One result as the bench prints it while it runs."""
    where = f"N={r['workers']} k={r['k'] or '-':>3} loss={r['loss'] * 100:g}%"
    if r.get("boxes", 1) > 1:
        where += f" boxes={r['boxes']}"
    if r.get("ports", 1) > 1:
        where += f" ports={r['ports']}"
    if r["status"] != "ok":
        return f"  {LABELS[r['system']]:<22} {where:<24} {r['status']}"
    cpu = r["cpu"]
    cpu_s = (f"CPU {cpu['busy_pct']:5.1f}% (softirq {cpu['softirq_pct']:.0f}%, "
             f"workers {r['workers_cpu_pct']:.0f}%)") if cpu else "CPU ?"
    retx = r["counters"].get("retransmissions")
    cpu_s += _per_gib_text(r)
    if disturbed(r):
        cpu_s += (f"  [disturbed: other processes {r.get('foreign_cpu_pct', 0):.0f}%"
                  + (f", {len(r['other_netns'])} other namespaces" if r.get("other_netns") else "")
                  + "]")
    return (f"  {LABELS[r['system']]:<22} {where:<24} TAT {r['tat_median_s'] * 1e3:8.1f} ms "
            f"[{r['tat_min_s'] * 1e3:.0f}-{r['tat_max_s'] * 1e3:.0f}]  "
            f"{r['goodput_mbps']:7.1f} Mbit/s = {r['bound_fraction'] * 100:5.1f}% of bound  "
            f"{cpu_s}" + (f"  retx {retx}" if retx is not None else ""))


def _per_gib_text(r: dict) -> str:
    """", CPU 1.23 s/GiB (box 0.05)": the ranks' (and the box's) CPU seconds
    per GiB reduced (bench/cpu_per_gib.py)."""
    g = r.get("cpu_s_per_gib")
    if not g:
        return ""
    return f", {g['ranks']:.2f} s/GiB" + (f" (box {g['box']:.2f})" if g.get("box") is not None else "")


def _matches(r: dict, system, workers, k, loss, boxes: int) -> bool:
    """Gloo's rows match every k and box count: it uses neither."""
    return (r["system"] == system and r["workers"] == workers and r["loss"] == loss
            and (system in GLOO_SYSTEMS or (r["k"] == k and r.get("boxes", 1) == boxes)))


def find_row(results, system, workers, k, loss, boxes: int = 1, ok: bool = True):
    """The row of one cell; ok: only one that ran to the end."""
    return next((r for r in results if _matches(r, system, workers, k, loss, boxes)
                 and (r["status"] == "ok" or not ok)), None)


def best_swml(results, workers, k, loss, boxes: int = 1):
    """The swml row the comparison uses: afxdp when it ran, else udp."""
    return (find_row(results, "swml-afxdp", workers, k, loss, boxes)
            or find_row(results, "swml-udp", workers, k, loss, boxes))


def cpu_ratio(sw: dict | None, gl: dict | None) -> float | None:
    """The swml row's ranks' CPU s/GiB over the Gloo row's (None without both)."""
    a, b = ((r or {}).get("cpu_s_per_gib") or {} for r in (sw, gl))
    return a["ranks"] / b["ranks"] if a.get("ranks") and b.get("ranks") else None


def summary(doc: dict) -> dict:
    """The figures of merit (README.md, "Measured"), per k: swml/gloo TAT
    ratio per N, goodput as a fraction of the bound, TAT(max N)/TAT(min N),
    loss inflation."""
    res, meta = doc["results"], doc["meta"]
    ws, losses = sorted(meta["workers"]), sorted(meta["losses"])
    first, *more = box_counts(meta)
    out = {}
    for k in meta["ks"]:
        s: dict = {"ratio_swml_gloo": {}, "cpu_per_gib_swml_gloo": {}, "swml_bound_fraction": {},
                   "swml_system": {},
                   "loss_inflation": {"swml": {}, "gloo": {}}, "boxes_speedup": {}}
        for n in ws:
            sw, gl = best_swml(res, n, k, 0.0, first), find_row(res, "gloo", n, None, 0.0)
            for m in more:
                sw_m = best_swml(res, n, k, 0.0, m)
                if sw and sw_m:
                    s["boxes_speedup"].setdefault(n, {})[m] = round(
                        sw["tat_median_s"] / sw_m["tat_median_s"], 3)
            if sw:
                s["swml_system"][n] = sw["system"]
                s["swml_bound_fraction"][n] = sw["bound_fraction"]
            if sw and gl:
                s["ratio_swml_gloo"][n] = round(sw["tat_median_s"] / gl["tat_median_s"], 3)
            if cpu_ratio(sw, gl) is not None:
                s["cpu_per_gib_swml_gloo"][n] = round(cpu_ratio(sw, gl), 3)
            for name, row0 in (("swml", sw), ("gloo", gl)):
                for p in losses[1:]:
                    row = (best_swml(res, n, k, p, first) if name == "swml"
                           else find_row(res, "gloo", n, None, p))
                    if row and row0:
                        s["loss_inflation"][name].setdefault(n, {})[p] = round(
                            row["tat_median_s"] / row0["tat_median_s"], 3)
        lo, hi = ws[0], ws[-1]
        for name in ("swml", "gloo"):
            a, b = ((best_swml(res, n, k, 0.0, first) if name == "swml"
                     else find_row(res, "gloo", n, None, 0.0)) for n in (lo, hi))
            if a and b and lo != hi:
                s[f"scaling_{name}"] = {"from": lo, "to": hi,
                                        "ratio": round(b["tat_median_s"] / a["tat_median_s"], 3)}
        out[k] = s
    return out


def _boxes_cell(meta: dict, workers: int, boxes: int, k: int) -> str:
    """A row's boxes and its own bound (constants.boxes_bound_s)."""
    bound = boxes_bound_s(meta["size_bytes"], workers, meta["rate_mbit"],
                          [meta.get("box_rate_mbit")] * boxes, k)
    return f"{boxes_label(boxes, meta.get('box_rate_mbit'))}, bound {bound * 1e3:.0f} ms"


def _cell(r: dict | None) -> str:
    if r is None:
        return "–"
    if r["status"] != "ok":
        return "not run" if _skipped(r) else r["status"].split(":")[0]
    cpu = r["cpu"]["busy_pct"] if r.get("cpu") else None
    mark = " †" if disturbed(r) else ""
    return (f"{r['tat_median_s'] * 1e3:.0f} ms · {r['bound_fraction'] * 100:.0f}% · "
            f"CPU {cpu:.0f}%" if cpu is not None else f"{r['tat_median_s'] * 1e3:.0f} ms") + (
        _per_gib_text(r).replace(", ", " · ", 1)) + mark


def _raw_cell(sw: dict | None) -> str:
    """The best swml's packets a second as a share of the raw path's (raw_lab.py)."""
    if not sw or sw.get("raw_pps_fraction") is None:
        return "–"
    return f"{sw['raw_pps_fraction'] * 100:.0f}% of {sw['raw_pps'] / 1e3:.0f} kpps"


def _skipped(r: dict) -> bool:
    """Not run because an earlier loss rate of its rank group failed
    ("failed: see above" in results written before the word "skipped")."""
    return r["status"].startswith(SKIPPED) or r["status"] == "failed: see above"


def _failure_detail(r: dict) -> str:
    """What a failed row's diagnostics say: the stuck rank's and the switch's counters."""
    rank = (r.get("rank_state") or {}).get("counters") or {}
    gauges = (r.get("rank_state") or {}).get("gauges") or {}
    sw = r.get("switch_counters") or {}
    bits = []
    if rank:
        bits.append(f"the stuck rank had sent {rank.get('packets_sent', 0)} packets "
                    f"({rank.get('retransmissions', 0)} retransmissions) and received "
                    f"{rank.get('results', 0)} results, {rank.get('shadow_replies', 0)} of "
                    f"them answers to retransmissions")
    if gauges.get("rto_us"):
        bits.append(f"its retransmission timeout had grown to {gauges['rto_us'] / 1e3:.0f} ms")
    if sw:
        bits.append(f"the switch had completed {sw.get('completed', 0)} slot rounds and answered "
                    f"{sw.get('shadow_reply', 0)} retransmissions")
    return "; ".join(bits)


def failures(doc: dict) -> list[str]:
    """The "Failures" section: every cell that did not run to the end, why, and
    the notes of whoever looked into them (meta["notes"])."""
    failed = [r for r in doc["results"] if r["status"].startswith("failed") and not _skipped(r)]
    notes = doc["meta"].get("notes", [])
    if not failed and not notes:
        return []
    lines = ["## Failures", ""]
    for r in failed:
        where = f"N={r['workers']}, k={r['k'] or '-'}, loss {r['loss'] * 100:g}%"
        if r.get("boxes", 1) > 1:
            where += f", {r['boxes']} boxes"
        skipped = [x for x in doc["results"] if _skipped(x) and x["system"] == r["system"]
                   and x["workers"] == r["workers"] and x["k"] == r["k"]
                   and x.get("boxes", 1) == r.get("boxes", 1)]
        line = f"- {LABELS[r['system']]}, {where}: {r['status'].removeprefix('failed: ')}"
        if detail := _failure_detail(r):
            line += f". {detail[0].upper()}{detail[1:]}"
        if skipped:
            line += (". Not run after it (same workers, same k): loss "
                     + ", ".join(f"{x['loss'] * 100:g}%" for x in skipped))
        lines.append(line + ".")
    lines += [f"- {note}" for note in notes]
    lines.append("")
    return lines


def markdown(doc: dict) -> str:
    meta, res = doc["meta"], doc["results"]
    systems = [s for s in SYSTEMS if s in meta["systems"]]
    lines = [
        f"# Lab benchmark: {meta.get('collective', 'allreduce')} on shaped links",
        "",
        f"`{meta['command']}` ({meta['started']}, {meta['duration_s']:.0f} s): "
        f"{meta['size_bytes'] / 2**20:g} MiB float32, every worker link {meta['rate_mbit']:g} Mbit/s "
        f"each way, {meta['warmup']} warm-up + {meta['iterations']} timed iterations, medians; "
        f"{meta['machine']['cores']} cores, kernel {meta['machine']['kernel']}; "
        f"machine before the run: load {meta['machine']['quiet_before']['loadavg']}.",
        "",
        "Each cell: median tensor aggregation time · goodput as a share of the system's "
        "header-adjusted link bound · machine CPU busy during the timed allreduces "
        "(100% = both cores) · the ranks' CPU seconds per GiB reduced (and the box's: its XDP "
        "program's BPF run time and the switch process). swml/gloo and CPU swml/gloo: afxdp's "
        "(udp's where afxdp did not run) TAT and ranks' CPU s/GiB over Gloo's; the bench's "
        "console prints every backend's CPU ratio. % of raw pps: its packets a second a worker "
        "(packets a call / TAT) as a share of the raw path's, a raw AF_XDP ping-pong of the same "
        "frames through a reflector in the switch's place, every worker at once (docs/"
        "performance.md, \"The path's ceiling\"). † = disturbed: meanwhile other processes used more than "
        f"{FOREIGN_WARN_PCT:g}% of the machine, or another lab's namespaces were up.",
        "",
    ]
    if meta.get("burst"):
        lines += [sweep_heading(meta["burst"]), ""]
    for name, why in meta.get("unavailable", {}).items():
        lines.append(f"- {LABELS[name]}: unavailable: {why}")
    if meta.get("unavailable"):
        lines.append("")
    counts = box_counts(meta)
    by_boxes = len(counts) > 1 or bool(meta.get("box_rate_mbit"))
    for k in meta["ks"]:
        lines += [f"## k = {k} ({4 * k} B payload a packet; swml bound "
                  f"{swml_bound_mbps(meta['rate_mbit'], k):.1f} Mbit/s)", "",
                  "| N | " + ("boxes | " if by_boxes else "") + "loss | "
                  + " | ".join(LABELS[s] for s in systems)
                  + " | swml/gloo | CPU swml/gloo | % of raw pps |",
                  "|---|" + ("---|" if by_boxes else "") + "---|" + "---|" * len(systems)
                  + "---|---|---|"]
        for n, m, p in ((n, m, p) for n in meta["workers"] for m in counts for p in meta["losses"]):
            rows = {s: find_row(res, s, n, k, p, m) or find_row(res, s, n, k, p, m, ok=False)
                    for s in systems}
            sw, gl = best_swml(res, n, k, p, m), find_row(res, "gloo", n, None, p)
            ratio = f"{sw['tat_median_s'] / gl['tat_median_s']:.2f}" if sw and gl else "–"
            cpu = cpu_ratio(sw, gl)
            lines.append(f"| {n} | " + (f"{_boxes_cell(meta, n, m, k)} | " if by_boxes else "")
                         + f"{p * 100:g}% | " + " | ".join(_cell(rows[s]) for s in systems)
                         + f" | {ratio} | {'–' if cpu is None else f'{cpu:.2f}'} | {_raw_cell(sw)} |")
        lines.append("")
    lines += ["## Figures of merit", ""]
    for k, s in summary(doc).items():
        lines.append(f"k = {k}:")
        if s["ratio_swml_gloo"]:
            lines.append("- TAT swml/gloo: " + ", ".join(
                f"N={n}: {v:.2f}" for n, v in s["ratio_swml_gloo"].items()))
        if s["cpu_per_gib_swml_gloo"]:
            lines.append("- the ranks' CPU s/GiB reduced, swml/gloo: " + ", ".join(
                f"N={n}: {v:.2f}" for n, v in s["cpu_per_gib_swml_gloo"].items()))
        if s["swml_bound_fraction"]:
            lines.append("- swml goodput / bound: " + ", ".join(
                f"N={n}: {v * 100:.1f}% ({s['swml_system'][n]})"
                for n, v in s["swml_bound_fraction"].items()))
        for name in ("swml", "gloo"):
            sc = s.get(f"scaling_{name}")
            if sc:
                lines.append(f"- {name} TAT({sc['to']})/TAT({sc['from']}): {sc['ratio']:.2f}")
        if s["boxes_speedup"]:
            lines.append(f"- swml TAT with {counts[0]} box{'es' if counts[0] > 1 else ''} / with "
                         "more: " + "; ".join(
                             f"N={n}: " + ", ".join(f"{m} boxes {v:.2f}x" for m, v in d.items())
                             for n, d in s["boxes_speedup"].items()))
        for name in ("swml", "gloo"):
            infl = s["loss_inflation"][name]
            if infl:
                lines.append(f"- {name} TAT at loss / loss-free: " + "; ".join(
                    f"N={n}: " + ", ".join(f"{p * 100:g}% x{v:.2f}" for p, v in d.items())
                    for n, d in infl.items()))
        lines.append("")
    lines += failures(doc)
    lines += ["## Definitions", ""] + [f"- **{k}**: {v}" for k, v in meta["definitions"].items()]
    lines.append("")
    return "\n".join(lines)
