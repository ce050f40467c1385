"""The GPU staging pipeline against a plain copy + allreduce + copy.

    python -m switchml_xdp.bench.gpu_staging [--sizes 1M,16M,64M] [--chunk 1M]
        [--buffers 3] [--gbps 100] [--iters 5] [--json]
    python -m switchml_xdp.bench.gpu_staging --switch 10.0.0.1 --backend udp   # a real Worker

Both sides quantize on the device (device_quant) and send the same int32
exponents and payload; they differ in how the payload crosses to the host:

* plain:  device_quant.allreduce_quantized -- the whole payload copied to the
  host, reduced, copied back, one step after the other;
* staged: staging.Pipeline -- chunks through a ring of pinned buffers, the
  next chunk's copy to the host and the previous chunk's copy back running
  while the current chunk is reduced.

The host allreduce is a job of one rank: by default a simulated link that
takes as long as --gbps needs to send the chunk (the switch's answer comes
back in the same time on the other direction), or a real Worker with
--switch (a switch that this host reaches; world 1). The figures are each
side's tensor time (median of --iters) and its rate in float32 GB/s; the
link alone is the lower bound.

Without a GPU it runs on the CPU with CpuOps (synchronous copies: nothing
overlaps) and says so: a check that the script works, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from ..torch import device_quant
from ..torch.staging import Pipeline, StagingConfig, ops_for

K = 256


def parse_count(text: str) -> int:
    """'4M' -> 4194304, '64K' -> 65536, '1000' -> 1000."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def simulated_link(gbps: float):
    """A host allreduce of one rank that takes the link's time for the bytes."""
    def allreduce(host: torch.Tensor, op: str) -> None:
        time.sleep(host.numel() * 4 * 8 / (gbps * 1e9))
    return allreduce


def worker_link(switch: str, backend: str):
    from ..client.api import Worker

    worker = Worker(switch, f"gpu-staging-bench-{time.time_ns() % 10**9}", 0, 1, backend=backend,
                    verbose=False)

    def allreduce(host: torch.Tensor, op: str) -> None:
        worker.allreduce(host.numpy(), op)
    return allreduce, worker


def _timed(run, sync, iters: int) -> float:
    run()                               # warm-up: buffers, streams, kernels
    sync()
    times = []
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(n: int, device: torch.device, config: StagingConfig, link, iters: int) -> dict:
    ops = ops_for(device)
    pipeline = Pipeline(ops, config)
    x = torch.randn(n, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def staged():
        with pipeline.on_stream(pipeline.accept([x])):
            y = pipeline.sum_quantized(x, K, 1, link)
            done = ops.record(ops.current_stream())
        ops.synchronize(done)
        return y

    def plain():
        return device_quant.allreduce_quantized(x, K, 1, link)

    assert torch.equal(staged(), plain()), "the two sides must give the same bits"
    t_plain, t_staged = _timed(plain, sync, iters), _timed(staged, sync, iters)
    gb = n * 4 / 1e9
    return {"elements": n, "plain_s": t_plain, "staged_s": t_staged,
            "plain_GBps": gb / t_plain, "staged_GBps": gb / t_staged,
            "speedup": t_plain / t_staged}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", help="float32 elements per tensor (K, M suffixes); default "
                   "1M,16M,64M on a GPU, 64K,256K on the CPU (a check, not a measurement)")
    p.add_argument("--chunk", help="staging chunk, in 4-byte words; default 1M (on the CPU 64K)")
    p.add_argument("--buffers", type=int, default=3, help="pinned host buffers in the ring")
    p.add_argument("--gbps", type=float, default=100.0, help="the simulated link's rate")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--switch", help="reduce through a real Worker (world 1) on this switch")
    p.add_argument("--backend", default="udp", help="the Worker's datapath (with --switch)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    config = StagingConfig(parse_count(a.chunk or ("1M" if gpu else "64K")), a.buffers)
    sizes = a.sizes or ("1M,16M,64M" if gpu else "64K,256K")
    worker = None
    if a.switch:
        link, worker = worker_link(a.switch, a.backend)
        link_name = f"Worker via {a.switch} ({a.backend})"
    else:
        link, link_name = simulated_link(a.gbps), f"simulated {a.gbps:g} Gbit/s link"
    if not gpu:
        print("NOT a GPU run: no CUDA device, so the CPU with CpuOps (synchronous copies, "
              "nothing overlaps); this only checks that the benchmark works", file=sys.stderr)
    where = torch.cuda.get_device_name(device) if gpu else "CPU with CpuOps: NOT a GPU run"
    rows = []
    try:
        for n in (parse_count(s) for s in sizes.split(",")):
            rows.append(measure(n, device, config, link, a.iters))
    finally:
        if worker is not None:
            worker.close()
    if a.json:
        print(json.dumps({"device": where, "gpu": gpu, "link": link_name, "chunk": config.chunk_elements,
                          "buffers": config.buffers, "rows": rows}))
        return 0
    print(f"{where}; {link_name}; chunk {config.chunk_elements} words, {config.buffers} buffers")
    print(f"{'elements':>10} {'plain ms':>9} {'staged ms':>9} "
          f"{'plain GB/s':>10} {'staged GB/s':>11} {'speedup':>7}")
    for r in rows:
        print(f"{r['elements']:>10} {r['plain_s'] * 1e3:>9.2f} {r['staged_s'] * 1e3:>9.2f} "
              f"{r['plain_GBps']:>10.3g} {r['staged_GBps']:>11.3g} {r['speedup']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
