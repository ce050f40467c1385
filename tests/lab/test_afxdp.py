"""The afxdp backend: the C engine's quantization against quant.py (bit for bit),
and real jobs over AF_XDP in the lab against the udp backend and the numpy
reference, alone and mixed with udp workers, overlapping calls, abort, stall,
and what it leaves behind.

The lab tests share the session's lab (8 workers) and switch (conftest.py): a
bcc compile costs ~1.5 s. Each afxdp Worker compiles its own redirect program
(one process-wide lock keeps bcc single-threaded), so a job is set up once and
then reduces many tensors.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import numpy as np
import pytest

from switchml_xdp import quant, wire

pytest.importorskip("switchml_xdp._engine", reason="the AF_XDP engine is not built")

from engine_calls import bits
from lab_jobs import start_idle_rank
from requires import needs_lab
from switchml_xdp import _engine

K = 256  # the session switch's k


# ----------------------------------------------------------- quantization in C


# ---------------------------------------------------------------- lab jobs

SIZES = [1, 255, 256, 257, 4097, 100_003, 1 << 20]  # elements; the last is 4 MiB


def float_input(rank: int, n: int, seed: int) -> np.ndarray:
    """Per-block magnitudes over float32's range, zeros, and a non-finite value
    in rank-specific places, so that exponents and the NONFINITE flag matter."""
    rng = np.random.default_rng([seed, rank, n])
    nb = quant.num_blocks(n, K)
    scale = (10.0 ** rng.integers(-30, 30, nb)).repeat(K)[:n]
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if n > 3 * K:
        x[K:2 * K] = 0
        x[rng.integers(2 * K, n)] = np.nan if rank % 2 else np.inf
    return x


def int_input(rank: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, rank, n, 1])
    x = rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)  # sums wrap
    return x


def exact_int_sum(xs) -> np.ndarray:
    return np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


def reduce_all(lab, switch, job: str, backends: list[str], tensors, timeout=180.0):
    """Each rank (thread in its worker namespace, backend backends[rank])
    reduces its list of tensors in order; returns the per-rank results and stats."""
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    world = len(backends)

    def body(rank, host):
        with Worker(lab.switch.ip, job, rank, world, backend=backends[rank], verbose=False,
                    stall_timeout=60) as w:
            assert w.backend_name == backends[rank]
            outs = []
            for t in tensors(rank):
                w.allreduce(t)
                outs.append(t)
            return outs, w.stats()

    return run_ranks(lab, lab.workers[:world], body, timeout=timeout)


def check_results(per_rank, world, seed):
    """Every rank holds the exact int32 sum and the reference float32 result."""
    for rank, (outs, _stats) in enumerate(per_rank):
        for i, n in enumerate(SIZES):
            ints = exact_int_sum([int_input(r, n, seed) for r in range(world)])
            assert np.array_equal(outs[2 * i], ints), f"rank {rank}: int32 n={n}"
            ref = quant.simulate_allreduce([float_input(r, n, seed) for r in range(world)], K)
            assert np.array_equal(bits(outs[2 * i + 1]), bits(ref)), f"rank {rank}: float32 n={n}"


def tensors_for(seed):
    def make(rank):
        for n in SIZES:
            yield int_input(rank, n, seed)
            yield float_input(rank, n, seed)
    return make


@needs_lab
@pytest.mark.parametrize("world", [1, 2, 4])
def test_afxdp_matches_udp_and_the_reference(lab8, switch, world):
    seed = 100 + world
    afx = reduce_all(lab8, switch, f"afxdp-w{world}", ["afxdp"] * world, tensors_for(seed))
    check_results(afx, world, seed)
    udp = reduce_all(lab8, switch, f"udp-w{world}", ["udp"] * world, tensors_for(seed))
    for (a_outs, a_stats), (u_outs, _) in zip(afx, udp):
        for a, u in zip(a_outs, u_outs):
            assert a.dtype == u.dtype and np.array_equal(a.view(np.uint32), u.view(np.uint32))
        assert a_stats["backend"] == "afxdp"
        # veth has no zero-copy AF_XDP: the engine fell back to copy mode,
        # where it sends through the port's UDP socket, runs as GSO messages
        assert a_stats["zero_copy"] == 0
        assert a_stats["udp_tx"] == 1 and a_stats["udp_gso"] == 1
        assert world == 1 or a_stats["udp_gso_sends"] > 0, a_stats
        assert a_stats["results"] == a_stats["packets_sent"] - a_stats["retransmissions"]
        for key in ("packets_sent", "retransmissions", "results", "duplicates", "shadow_replies"):
            assert key in a_stats


@needs_lab
def test_a_job_mixing_afxdp_and_udp_workers(lab8, switch):
    seed = 7
    per_rank = reduce_all(lab8, switch, "mixed", ["afxdp", "udp", "udp", "afxdp"],
                          tensors_for(seed))
    check_results(per_rank, 4, seed)
    assert [s["backend"] for _, s in per_rank] == ["afxdp", "udp", "udp", "afxdp"]


@needs_lab
def test_sends_stay_on_the_afxdp_socket_where_asked(lab8, switch, monkeypatch):
    """SWML_AFXDP_UDP_TX=0: copy mode sends through the AF_XDP socket too,
    frame by frame (the A/B of docs/performance.md, "The afxdp backend's
    sends in copy mode"), and the sums are the same."""
    monkeypatch.setenv("SWML_AFXDP_UDP_TX", "0")
    seed = 11
    sizes = SIZES[:-1]

    def tensors(rank):
        for n in sizes:
            yield int_input(rank, n, seed)

    per_rank = reduce_all(lab8, switch, "xsk-tx", ["afxdp"] * 2, tensors)
    for outs, stats in per_rank:
        for out, n in zip(outs, sizes):
            assert np.array_equal(out, exact_int_sum([int_input(r, n, seed) for r in range(2)]))
        assert stats["udp_tx"] == 0 and "udp_gso_sends" not in stats, stats


@needs_lab
def test_a_jobs_first_call_finds_every_rank_streaming(lab8, switch):
    """An afxdp Worker compiles its redirect program before it joins (api.py),
    so the join's barrier finds every rank milliseconds from streaming. The 4
    ranks here are threads of one process, whose bcc compiles take turns (a
    second or more each): compiled after the barrier, the three that compiled
    first resent 113-136 packets each in the first call, probing for the last."""
    world, packets = 4, 80
    n = packets * K

    def tensors(rank):
        yield np.arange(n, dtype=np.int32) + rank

    per_rank = reduce_all(lab8, switch, "first-call", ["afxdp"] * world, tensors)
    exact = exact_int_sum([np.arange(n, dtype=np.int32) + r for r in range(world)])
    for outs, _ in per_rank:
        assert np.array_equal(outs[0], exact)
    resent = [stats["retransmissions"] for _, stats in per_rank]
    assert sum(resent) < packets, resent   # each early rank alone resent more


@needs_lab
def test_two_overlapping_allreduce_async_calls(lab8, switch):
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    n1, n2 = 300_001, 77_777
    xs = [np.random.default_rng([5, r]).standard_normal(n1).astype(np.float32) for r in range(2)]
    ys = [np.random.default_rng([6, r]).integers(-1000, 1000, n2).astype(np.int32) for r in range(2)]

    def body(rank, host):
        with Worker(lab8.switch.ip, "overlap", rank, 2, backend="afxdp", verbose=False) as w:
            a, b = xs[rank].copy(), ys[rank].copy()
            fa, fb = w.allreduce_async(a), w.allreduce_async(b)
            return fb.result(timeout=60), fa.result(timeout=60)

    ref_f = quant.simulate_allreduce(xs, K)
    for b, a in run_ranks(lab8, lab8.workers[:2], body):
        assert np.array_equal(bits(a), bits(ref_f))
        assert np.array_equal(b, ys[0] + ys[1])


@contextlib.contextmanager
def _rank0_beside_an_idle_rank1(lab, job: str, **worker_kw):
    """Rank 0 of a 2-rank job on afxdp, joined, whose rank 1 (its own process,
    yielded too) joined and never sends: rank 0's calls wait in C."""
    from switchml_xdp import Worker

    idle = start_idle_rank(lab, lab.workers[1], job, 1, 2)
    try:
        with lab.enter(lab.workers[0]):
            w = Worker(lab.switch.ip, job, 0, 2, backend="afxdp", verbose=False, **worker_kw)
        with w:
            assert idle.stdout.readline().strip() == "joined"
            yield w, idle
    finally:
        idle.kill()
        idle.wait()


@needs_lab
def test_abort_of_another_rank_raises_job_aborted_promptly(lab8, switch):
    from switchml_xdp.client.control import JobAborted

    with _rank0_beside_an_idle_rank1(lab8, "abortme") as (w, idle):
        fut = w.allreduce_async(np.ones(1 << 20, np.float32))
        time.sleep(0.5)
        assert not fut.done()  # rank 1 sends nothing: rank 0 waits in C
        t0 = time.monotonic()
        idle.kill()
        with pytest.raises(JobAborted, match="abortme"):
            fut.result(timeout=10)
        assert time.monotonic() - t0 < 3.0
        with pytest.raises(JobAborted):
            w.allreduce(np.ones(10, np.int32))


@needs_lab
def test_a_woken_call_reads_its_abort_flag_at_once(lab8, switch, monkeypatch):
    """A waiting engine sleeps until its next timer, at most 50 ms
    (worker/stream.c, SLEEP_MAX_NS); the backend's abort sets the flag and
    wakes the sleep through the engine's eventfd (Engine.wake), so the call
    ends at once. With 10 s timers only the 50 ms cap is left: without the
    wake the median of 5 would be about 25 ms."""
    import statistics
    import threading

    for knob in ("INITIAL", "MIN", "MAX"):
        monkeypatch.setenv(f"SWML_AFXDP_RTO_{knob}", "10")
    with _rank0_beside_an_idle_rank1(lab8, "wakeme") as (w, _):
        be, engine = w._backend, w._backend._engine
        waits = []
        for _ in range(5):
            status: list[int] = []
            be._abort[0] = 0
            x = np.ones(1 << 14, np.int32)
            t = threading.Thread(target=lambda: status.append(
                engine.allreduce(x, wire.OP_SUM, 7, wire.FMT_INT32)))
            t.start()
            # (not a multiple of the 50 ms cap: the sleep would just be ending)
            time.sleep(0.325)
            assert t.is_alive()      # rank 1 sends nothing: rank 0 sleeps in C
            t0 = time.monotonic()
            be._abort[0] = 1
            engine.wake()
            t.join(5)
            waits.append(time.monotonic() - t0)
            assert status == [_engine.ABORTED], status
        assert statistics.median(waits) < 0.005, waits


@needs_lab
def test_stall_timeout_raises_timeout_error(lab8, switch):
    with _rank0_beside_an_idle_rank1(lab8, "stallme", stall_timeout=1.0) as (w, _):
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no result from the switch for 1 s"):
            w.allreduce(np.ones(5000, np.int32))
        assert 0.9 < time.monotonic() - t0 < 5.0
        assert w.stats()["retransmissions"] > 0


def _xdp_on(lab, host) -> str:
    return lab.run(host, ["ip", "link", "show", "dev", host.iface]).stdout


@needs_lab
def test_stack_keeps_working_and_close_leaves_nothing(lab8, switch):
    """While the redirect program is attached, ARP/ICMP/TCP still reach the stack;
    after close the interface has no XDP program left."""
    from switchml_xdp import Worker

    host = lab8.workers[5]
    with lab8.enter(host):
        w = Worker(lab8.switch.ip, "solo", 0, 1, backend="afxdp", verbose=False)
    with w:
        assert "swml_redirect" in _xdp_on(lab8, host)
        lab8.run(host, ["ip", "neigh", "flush", "dev", host.iface])
        lab8.run(host, ["ping", "-c1", "-W2", lab8.switch.ip])     # ARP + ICMP pass
        x = np.arange(1000, dtype=np.int32)
        w.allreduce(x)
        assert np.array_equal(x, np.arange(1000, dtype=np.int32))
        assert w.stats()["shadow_replies"] >= 0
    assert "xdp" not in _xdp_on(lab8, host)


@needs_lab
def test_a_redirect_program_that_does_not_compile_fails_before_the_join(lab8, switch,
                                                                        monkeypatch):
    """The Worker compiles before it joins: a compile that fails raises with
    backend "afxdp" before anything reached the switch (a world-2 job whose
    other rank never comes would otherwise wait out its join), and under
    "auto" the job goes on with udp."""
    from switchml_xdp import Worker
    from switchml_xdp.client import afxdp_backend

    def no_compiler(port, local_ip, lanes):
        raise RuntimeError("cannot load the worker's XDP program (swml_redirect.c): test")

    monkeypatch.setattr(afxdp_backend, "compile_redirect", no_compiler)
    host = lab8.workers[5]
    began = time.monotonic()
    with lab8.enter(host), pytest.raises(RuntimeError, match=r"swml_redirect\.c\): test"):
        Worker(lab8.switch.ip, "nocompile-a", 0, 2, backend="afxdp", verbose=False,
               join_timeout=30)
    assert time.monotonic() - began < 5   # not at the barrier
    with lab8.enter(host):
        w = Worker(lab8.switch.ip, "nocompile-b", 0, 1, backend="auto", verbose=False)
    with w:
        assert w.backend_name == "udp"
        x = np.arange(5, dtype=np.int32)
        assert np.array_equal(w.allreduce(x), np.arange(5, dtype=np.int32))


@needs_lab
def test_unavailable_reason_and_a_clear_error_when_the_interface_is_taken(lab8, switch):
    from switchml_xdp import Worker
    from switchml_xdp.client import afxdp_backend

    assert afxdp_backend.unavailable_reason() is None
    host = lab8.workers[6]
    with lab8.enter(host):
        a = Worker(lab8.switch.ip, "taken-a", 0, 1, backend="afxdp", verbose=False)
    try:
        with lab8.enter(host), pytest.raises(RuntimeError, match="already has an XDP program"):
            Worker(lab8.switch.ip, "taken-b", 0, 1, backend="afxdp", verbose=False, port=48870)
        # auto falls back to udp for the same join (same port and address).
        with lab8.enter(host):
            b = Worker(lab8.switch.ip, "taken-c", 0, 1, backend="auto", verbose=False, port=48871)
        with b:
            assert b.backend_name == "udp"
            x = np.arange(5, dtype=np.int32)
            assert np.array_equal(b.allreduce(x), np.arange(5, dtype=np.int32))
        y = np.arange(7, dtype=np.float32)
        assert np.array_equal(a.allreduce(y), np.arange(7, dtype=np.float32))
    finally:
        a.close()
    assert "xdp" not in _xdp_on(lab8, host)


@needs_lab
@pytest.mark.timeout(120)
def test_exact_through_lossy_and_duplicating_links(lab8, switch):
    """5 % loss and 1 % duplication each way on every worker link: afxdp workers
    (and a udp one in the same job) still end with the exact results; lost
    RESULTs come back as shadow replies, duplicates are ignored."""
    from switchml_xdp.lab.cluster import run_ranks

    backends = ["afxdp", "afxdp", "afxdp", "udp"]
    world, hosts = len(backends), lab8.workers[:4]
    sizes = [40_000, 257, 100_000]
    ints = [[int_input(r, n, 11) for r in range(world)] for n in sizes]
    floats = [[float_input(r, n, 12) for r in range(world)] for n in sizes]

    def body(rank, host):
        from switchml_xdp import Worker

        with Worker(lab8.switch.ip, "lossy-afxdp", rank, world, backend=backends[rank],
                    verbose=False, stall_timeout=30) as w:
            outs = []
            for i in range(len(sizes)):
                for t in (ints[i][rank].copy(), floats[i][rank].copy()):
                    w.allreduce(t)
                    outs.append(t)
            return outs, w.stats()

    lab8.set_loss(0.05, dup=0.01, hosts=hosts, direction="both")
    try:
        results = run_ranks(lab8, hosts, body, timeout=100)
    finally:
        lab8.set_loss(0, hosts=lab8.workers)
    for i in range(len(sizes)):
        ref_i = exact_int_sum(ints[i])
        ref_f = quant.simulate_allreduce(floats[i], K)
        for rank in range(world):
            outs = results[rank][0]
            assert np.array_equal(outs[2 * i], ref_i), (rank, sizes[i])
            assert np.array_equal(bits(outs[2 * i + 1]), bits(ref_f)), (rank, sizes[i])
    for rank in range(3):
        stats = results[rank][1]
        assert stats["retransmissions"] > 0 and stats["duplicates"] > 0, stats
    assert sum(results[r][1]["shadow_replies"] for r in range(3)) > 0


@needs_lab
def test_a_killed_afxdp_worker_leaves_no_program_behind(lab8, switch):
    """The redirect program hangs on a BPF link owned by the worker process:
    SIGKILL detaches it with the process."""
    host = lab8.workers[7]
    code = ("import time\n"
            "from switchml_xdp import Worker\n"
            f"w = Worker({lab8.switch.ip!r}, 'killed', 0, 1, backend='afxdp', verbose=False)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    p = lab8.popen(host, [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert "swml_redirect" in _xdp_on(lab8, host)
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 5
    while "xdp" in _xdp_on(lab8, host) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "xdp" not in _xdp_on(lab8, host)
