"""Workers of wire format v2 end to end against the real XDP switch,
on both backends and mixed in one job: SUM/MIN/MAX exact for int32 and float32
(NaN, inf, -0.0 included), ranks that make different calls all raise
CallMismatch within seconds and the next matching call is exact, a job whose
seq starts just below 2^32 streams through the wrap, and a worker's port is
refused to anyone else on its host."""
from __future__ import annotations

import subprocess
import time

import numpy as np
import pytest

from lab_jobs import K, run_job, skip_without_afxdp
from requires import needs_lab
from switchml_xdp import quant

BACKEND_SETS = {"udp": ["udp", "udp"], "afxdp": ["afxdp", "afxdp"],
                "mixed": ["afxdp", "udp", "afxdp"]}
WRAP_SEQ = 0xFFFFFF00


def special_floats(rank: int, n: int) -> np.ndarray:
    """Random floats over a wide range with NaN, +-inf and both zeros at
    places where the ranks differ."""
    rng = np.random.default_rng([21, rank, n])
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45], np.float32)
    idx = rng.choice(n, size=min(n, 40), replace=False)
    x[idx] = specials[rng.integers(0, specials.size, idx.size)]
    return x


def ieee(op: str, xs) -> np.ndarray:
    """IEEE 754-2019 minimum/maximum over ranks: numpy's, with -0.0 < +0.0."""
    out = xs[0].copy()
    for x in xs[1:]:
        out = (np.minimum if op == "min" else np.maximum)(out, x)
    pos = np.stack([(x == 0) & ~np.signbit(x) for x in xs]).any(axis=0)
    neg = np.stack([(x == 0) & np.signbit(x) for x in xs]).any(axis=0)
    zero = out == 0
    out[zero] = np.where(neg[zero] if op == "min" else ~pos[zero], np.float32(-0.0),
                         np.float32(0.0))
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit, except that any NaN equals any NaN."""
    nan = np.isnan(a) if a.dtype == np.float32 else np.zeros(a.shape, bool)
    if a.dtype == np.float32 and not np.array_equal(nan, np.isnan(b)):
        return False
    return np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


def cases(world: int, n: int):
    """(name, per-rank inputs, op, expected result) for every op and dtype."""
    rng = [np.random.default_rng([22, r, n]) for r in range(world)]
    ints = [g.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32) for g in rng]
    floats = [special_floats(r, n) for r in range(world)]
    wrap = np.sum(np.stack(ints).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)
    sum_floats = [np.nan_to_num(f, nan=1.0, posinf=2.0, neginf=-2.0) for f in floats]
    yield "int32 sum", ints, "sum", wrap
    yield "int32 min", ints, "min", np.min(np.stack(ints), axis=0)
    yield "int32 max", ints, "max", np.max(np.stack(ints), axis=0)
    yield "float32 min", floats, "min", ieee("min", floats)
    yield "float32 max", floats, "max", ieee("max", floats)
    yield "float32 sum", sum_floats, "sum", quant.simulate_allreduce(sum_floats, K)


@needs_lab
@pytest.mark.parametrize("kind", list(BACKEND_SETS))
def test_sum_min_max_are_exact_for_int32_and_float32(lab8, switch, kind):
    backends = BACKEND_SETS[kind]
    skip_without_afxdp(backends)
    world = len(backends)
    sizes = [1, 1000, 70_001]
    want = {(n, name): (inputs, op, expect) for n in sizes
            for name, inputs, op, expect in cases(world, n)}

    def body(rank, w):
        outs = {}
        for (n, name), (inputs, op, _) in want.items():
            x = inputs[rank].copy()
            assert w.allreduce(x, op=op) is x
            outs[n, name] = x
        return outs

    for rank, outs in enumerate(run_job(lab8, f"ops-{kind}", backends, body)):
        for key, (_, _, expect) in want.items():
            assert same_bits(outs[key], expect), f"rank {rank} ({backends[rank]}): {key}"


MISMATCHES = {
    # what the last rank does differently in call #1
    "length": lambda x, op: (x[:-3].copy(), op),
    "longer": lambda x, op: (np.concatenate([x, x]), op),
    "dtype": lambda x, op: (x.astype(np.float32), op),
    "op": lambda x, op: (x.copy(), "max"),
}


@needs_lab
@pytest.mark.parametrize("kind", list(BACKEND_SETS))
@pytest.mark.parametrize("mismatch", list(MISMATCHES))
def test_ranks_that_disagree_all_raise_call_mismatch_and_the_job_goes_on(lab8, switch, kind,
                                                                         mismatch):
    from switchml_xdp import CallMismatch

    backends = BACKEND_SETS[kind]
    skip_without_afxdp(backends)
    world, n = len(backends), 50_000
    xs = [np.random.default_rng([23, r]).integers(-1000, 1000, n).astype(np.int32)
          for r in range(world)]
    job = f"mm-{kind}-{mismatch}"

    def body(rank, w):
        a = xs[rank].copy()
        w.allreduce(a)  # call #0: all agree
        b, op = xs[rank].copy(), "sum"
        if rank == world - 1:
            b, op = MISMATCHES[mismatch](b, op)
        t0 = time.monotonic()
        with pytest.raises(CallMismatch) as err:
            w.allreduce(b, op=op)
        took = time.monotonic() - t0
        c = xs[rank].copy()
        w.allreduce(c, op="max")  # call #2: all agree again
        return a, str(err.value), took, c

    total = np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.int32)
    for rank, (a, msg, took, c) in enumerate(run_job(lab8, job, backends, body)):
        assert np.array_equal(a, total)
        assert msg.startswith(f"allreduce #1 of job '{job}' (") and \
            "the ranks did not make the same call (length, dtype or op differ" in msg, msg
        assert took < 5.0, f"rank {rank}: CallMismatch after {took:.1f} s"
        assert np.array_equal(c, np.max(np.stack(xs), axis=0)), f"rank {rank} after the mismatch"


@needs_lab
@pytest.mark.lab_workers(3)
def test_a_job_streams_through_the_seq_wrap(fresh_lab):
    """A switch whose jobs start at seq 2^32 - 256: both backends stream
    through the wrap exactly, fail a mismatched call there and go on."""
    from switchml_xdp import CallMismatch
    from switchml_xdp.lab.cluster import SwitchProcess

    backends = ["afxdp", "udp", "afxdp"]
    skip_without_afxdp(backends)
    world = len(backends)
    xs = [np.random.default_rng([24, r]).integers(-2**31, 2**31, 200_000, dtype=np.int64)
          .astype(np.int32) for r in range(world)]
    fs = [special_floats(r, 100_000) for r in range(world)]

    def body(rank, w):
        assert w.info.seq_base == WRAP_SEQ
        outs = []
        for _ in range(3):  # 782 packets each: through the wrap in the first
            a = xs[rank].copy()
            w.allreduce(a)
            outs.append(a)
        f = fs[rank].copy()
        w.allreduce(f, op="min")
        outs.append(f)
        with pytest.raises(CallMismatch):
            w.allreduce(np.ones(10 + rank, np.int32))
        a = xs[rank].copy()
        w.allreduce(a, op="max")
        outs.append(a)
        return outs, w._backend.next_index

    with SwitchProcess(fresh_lab, ["--initial-seq", str(WRAP_SEQ)]):
        per_rank = run_job(fresh_lab, "wrap", backends, body)
    total = np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)
    for rank, (outs, next_index) in enumerate(per_rank):
        for a in outs[:3]:
            assert np.array_equal(a, total), f"rank {rank}"
        assert same_bits(outs[3], ieee("min", fs)), f"rank {rank}: float32 min"
        assert np.array_equal(outs[4], np.max(np.stack(xs), axis=0)), f"rank {rank}: max"
        assert next_index > 2**24  # resynced after the mismatch, past the wrap
    assert len({ni for _, ni in per_rank}) == 1  # every rank at the same packet


NOBODY_BINDS = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError as e:
    print("refused", e.errno)
else:
    print("bound")
"""


@needs_lab
@pytest.mark.parametrize("backend", ["udp", "afxdp"])
def test_the_workers_port_is_refused_to_a_second_binder(lab8, switch, backend):
    from switchml_xdp import Worker

    skip_without_afxdp([backend])
    host, port = lab8.workers[7], 48930 if backend == "udp" else 48931
    with lab8.enter(host):
        w = Worker(lab8.switch.ip, f"port-{backend}", 0, 1, backend=backend, verbose=False,
                   port=port)
    with w:
        # The held socket is a member of the job's group (IGMP reports go out).
        maddr = lab8.run(host, ["ip", "maddr", "show", "dev", host.iface]).stdout
        assert f"inet  {w.info.group_ip}" in maddr or f"inet {w.info.group_ip}" in maddr, maddr
        # A local unprivileged user, with every reuse option, on any address.
        for addr in ("0.0.0.0", host.ip):
            r = lab8.run(host, ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "/usr/bin/python3", "-c", NOBODY_BINDS, addr, str(port)])
            assert r.stdout.split() == ["refused", "98"], r.stdout + r.stderr
        # Another rank on the same host, with the same port: one clear line.
        with lab8.enter(host), pytest.raises(OSError, match=rf"^UDP port {port} is in use on "
                                                            r"this host \(by another rank"):
            Worker(lab8.switch.ip, f"port2-{backend}", 0, 1, backend="udp", verbose=False,
                   port=port)
        x = np.arange(10, dtype=np.int32)
        assert np.array_equal(w.allreduce(x), np.arange(10, dtype=np.int32))
    r = lab8.run(host, ["/usr/bin/python3", "-c", NOBODY_BINDS, "0.0.0.0", str(port)])
    assert r.stdout.split() == ["bound"]  # released with the Worker
    assert w.info.group_ip not in lab8.run(host, ["ip", "maddr", "show", "dev", host.iface]).stdout


def test_mismatch_cases_are_really_different_calls():
    x = np.zeros(10, np.int32)
    for make in MISMATCHES.values():
        y, op = make(x, "sum")
        assert (y.size, y.dtype, op) != (x.size, x.dtype, "sum")


@needs_lab
def test_bench_cli_op_verifies_min_and_max(lab8, switch):
    import json
    import sys

    argv = [sys.executable, "-m", "switchml_xdp.cli.worker", "bench", "--switch", lab8.switch.ip,
            "--world", "2", "--size", "100KiB", "--iterations", "1", "--warmup", "1", "--verify",
            "--json", "--backend", "udp", "--port", "48912", "-q"]
    for op, dtype in (("min", "float32"), ("max", "int32")):
        procs = [lab8.popen(h, argv + ["--rank", str(r), "--job", f"bench-{op}", "--op", op,
                                       "--dtype", dtype],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r, h in enumerate(lab8.workers[:2])]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            res = json.loads(out)
            assert (res["op"], res["dtype"], res["verified"], res["verify_failures"]) == \
                (op, dtype, 2, 0)


@needs_lab
def test_an_empty_call_against_a_full_one_is_a_mismatch_too(lab8, switch):
    from switchml_xdp import CallMismatch

    def body(rank, w):
        x = np.arange(100 * rank, dtype=np.float32)
        t0 = time.monotonic()
        with pytest.raises(CallMismatch, match=r"allreduce #0 of job 'mm-empty' \((0|100) float32"):
            w.allreduce(x)
        took = time.monotonic() - t0
        e = np.zeros(0, np.float32)
        assert w.allreduce(e, op="min") is e  # both empty: fine
        return took

    assert max(run_job(lab8, "mm-empty", ["udp", "afxdp"], body)) < 5.0


@needs_lab
def test_the_engine_checks_results_again_behind_the_redirect_program(lab8, switch):
    """RESULTs with the switch's own address and port as source (root in the
    switch's namespace: beyond the threat model, but it gets past the redirect
    program) that are not of the call in flight: another tag, op, job, count,
    type or format. The afxdp engine ignores every one; the sums stay exact."""
    import threading

    from crafted_packets import raw_socket
    from frames import Endpoint, endpoint, udp_frame
    from switchml_xdp import wire
    from switchml_xdp.client.calls import call_tag

    backends = ["afxdp", "afxdp"]
    skip_without_afxdp(backends)
    n, calls = 60_000, 6
    npk = -(-n // K)
    xs = [np.random.default_rng([25, r]).integers(-1000, 1000, n).astype(np.int32) for r in range(2)]
    joined, stop, sent = threading.Event(), threading.Event(), [0]
    infos = {}

    def forge():
        joined.wait(30)
        info = infos[0]
        src = endpoint(lab8.switch, info.switch_port)
        h0 = lab8.workers[0]
        dsts = [endpoint(h0, info.port), Endpoint(info.group_mac, info.group_ip, info.port)]
        evil = np.full(K, 0x7777, np.int32)
        raw = raw_socket(lab8, lab8.switch)
        try:
            while not stop.is_set():
                for c in range(calls):
                    tag = call_tag(c, n, "int32", "sum")
                    for p in range(0, npk, 7):
                        i = c * npk + p
                        f = {"seq": (info.seq_base + i) & 0xFFFFFFFF, "slot": i % info.slots,
                             "flags": (i // info.slots) & 1, "tag": tag, "op": wire.OP_SUM}
                        for bad in ({"tag": tag ^ 1}, {"op": wire.OP_MAX}, {"job": info.job_id + 1},
                                    {"kind": wire.TYPE_DATA}, {"fmt": 1}):
                            g = {**f, "job": info.job_id, "kind": wire.TYPE_RESULT, **bad}
                            d = wire.datagram(g["kind"], g["job"], 0, g["slot"], g["seq"], evil,
                                              flags=g["flags"], tag=g["tag"], op=g["op"],
                                              fmt=g.get("fmt", 0))
                            for dst in dsts:
                                raw.send(udp_frame(src, dst, d))
                                sent[0] += 1
                        if stop.is_set():
                            return
                    time.sleep(0.001)
        finally:
            raw.close()

    def body(rank, w):
        infos[rank] = w.info
        if rank == 0:
            joined.set()
        outs = []
        for _ in range(calls):
            a = xs[rank].copy()
            w.allreduce(a)
            outs.append(a)
        return outs, w.stats()

    t = threading.Thread(target=forge, daemon=True)
    t.start()
    try:
        per_rank = run_job(lab8, "engine-recheck", backends, body)
    finally:
        stop.set()
        joined.set()
        t.join(10)
    total = xs[0] + xs[1]
    for outs, _ in per_rank:
        for a in outs:
            assert np.array_equal(a, total)
    stats = per_rank[0][1]
    assert sent[0] > 0 and stats["ignored"] > 0, (sent[0], stats)


@needs_lab
def test_a_bad_op_is_refused_before_anything_is_sent(lab8, switch):
    def body(rank, w):
        before = w.stats()
        for op in ("avg", "SUM", None):
            with pytest.raises(ValueError, match="op must be one of sum, min, max"):
                w.allreduce(np.ones(10, np.int32), op=op)
            with pytest.raises(ValueError, match="op must be one of sum, min, max"):
                w.allreduce_async(np.ones(10, np.float32), op=op)
        after = w.stats()
        assert after["packets_sent"] == before["packets_sent"] and after["tensors"] == 0
        x = np.arange(10, dtype=np.int32)  # call #0 still: the refused ones were no calls
        assert np.array_equal(w.allreduce(x, op="min"), np.arange(10, dtype=np.int32))
        return True

    run_job(lab8, "bad-op", ["udp"], body)
