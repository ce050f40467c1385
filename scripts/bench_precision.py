"""precision 16 against 32 over shaped lab links (docs/quantization.md, "Where
it stands, measured"); as root, with nothing else running:
  .venv/bin/python scripts/bench_precision.py WORKERS RATE_MBIT QUEUE SIZE_MIB ITERS [backend] [k]
e.g. `... 2 200 32 4 7 afxdp 256`.
Each rank alternates 32- and 16-bit float32 sums of the same tensor (after one
warm-up of each); elements/s = n / median (and fastest) time of the slowest rank."""
import json
import subprocess
import sys

from switchml_xdp.lab import Lab
from switchml_xdp.lab.cluster import SwitchProcess

N, rate, queue, mib, iters = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
backend = sys.argv[6] if len(sys.argv) > 6 else "afxdp"
k = sys.argv[7] if len(sys.argv) > 7 else "256"
RANK = r'''
import json, sys, time, numpy as np
from switchml_xdp import Worker
rank, N, n, iters, backend = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
with Worker(sys.argv[6], "b16", rank, N, backend=backend, verbose=False) as w:
    ts = {"32": [], "16": []}
    for i in range(iters + 1):
        for p in ("32", "16"):
            a = x.copy(); t = time.perf_counter(); w.allreduce(a, precision=p)
            if i: ts[p].append(time.perf_counter() - t)
    s = w.stats()
    out = {p: sorted(v)[len(v) // 2] for p, v in ts.items()}
    out.update({"min" + p: min(v) for p, v in ts.items()})
    out.update({k: s.get(k) for k in ("packets_sent", "retransmissions", "cwnd", "srtt_us")})
    print(json.dumps(out))
'''
kw = dict(workers=N)
if rate:
    kw["rate_mbit"] = rate
    if queue:
        kw["queue_packets"] = queue
with Lab(**kw) as lab, SwitchProcess(lab, ["-k", k]):
    n = int(mib * 2**20 / 4)
    ps = [lab.popen(h, [sys.executable, "-c", RANK, str(r), str(N), str(n), str(iters), backend, lab.switch.ip],
                    stdout=subprocess.PIPE, text=True) for r, h in enumerate(lab.workers)]
    outs = [p.communicate(timeout=600)[0] for p in ps]
    res = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    t32 = max(r["32"] for r in res); t16 = max(r["16"] for r in res)
    m32 = max(r["min32"] for r in res); m16 = max(r["min16"] for r in res)
    print(f"{backend} N={N} rate={rate} q={queue} k={k} size={mib}MiB iters={iters}: "
          f"32-bit {n/t32/1e6:.2f} M el/s ({t32*1e3:.0f} ms), 16-bit {n/t16/1e6:.2f} M el/s "
          f"({t16*1e3:.0f} ms): ratio {t32/t16:.2f}x; fastest {m32*1e3:.0f} / {m16*1e3:.0f} ms: "
          f"{n/m32/1e6:.2f} / {n/m16/1e6:.2f} M el/s, ratio {m32/m16:.2f}x | " + " | ".join(json.dumps(r) for r in res), flush=True)
