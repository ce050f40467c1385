"""Reliability (issue 4): loss in both directions for both backends, four
tenants on one switch and crafted packets across jobs, and a fuzz of more than
100k random and mutated packets with every one of them accounted for.

All tests share the session's lab (8 workers) and switch (conftest.py) and
compare counters as deltas. The switch's counters obey
    rx = aggregated + completed + shadow_reply + dup_dropped + sum(drop reasons)
(docs/design-decisions.md); the lab's loss injector counts, per link and
direction, seen = dropped + passed (switchml_xdp/lab/loss.py).

Lines starting with "[reliability]" are the measurements docs/reliability.md
quotes (run with -s to see them).
"""
from __future__ import annotations

import errno
import itertools
import json
import socket
import threading
import time
from contextlib import closing

import numpy as np
import pytest

from conftest import NO_LAB
from frames import Endpoint, endpoint, udp_frame

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from switchml_xdp import quant, wire
from switchml_xdp.lab import netns
from switchml_xdp.lab.cluster import run_ranks
from switchml_xdp.switch.maps import SwitchMaps

K = wire.DEFAULT_K
PORT = wire.DEFAULT_PORT
PAYLOAD_LEN = wire.HDR_LEN + 4 * K                 # a whole DATA datagram's UDP payload
OUTCOMES = ["aggregated", "completed", "shadow_reply", "dup_dropped"]
IP_RECVERR = 11                                    # <linux/in.h>: local drops become ENOBUFS
_names = itertools.count()


def report(what: str, **values) -> None:
    print(f"[reliability] {what}: " + ", ".join(f"{k}={v}" for k, v in values.items()), flush=True)


def job_name(tag: str) -> str:
    return f"rel-{tag}-{next(_names)}"


# ------------------------------------------------------------------ counters

def switch_counters(sw) -> dict[str, int]:
    with closing(SwitchMaps(sw.iface)) as maps:
        return maps.read_counters()


def cdelta(before: dict, after: dict) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def outcome_sum(d: dict) -> int:
    """What the counters say happened to the packets counted in rx."""
    return sum(d[k] for k in OUTCOMES) + sum(d[r] for r in wire.DROP_REASONS)


def loss_delta(before: dict, after: dict) -> dict:
    return {h: {dr: {k: after[h][dr][k] - before[h][dr][k] for k in after[h][dr]}
                for dr in after[h]} for h in after}


def link_drops(lab) -> dict[str, int]:
    """tx_dropped of every veth on the lab's data path, by interface name.

    A veth drops a frame when its peer's XDP ring is full (the peers of every
    lab link run an XDP program, so frames cross in NAPI rings of 256): the
    count appears as tx_dropped of the sending end. Upstream, frames are sent
    by a worker's interface (into its bridge-side peer) and then by the
    switch's bridge-side end `bs` (into the switch's interface, where the
    switch program runs); these are the only places between a sender and the
    switch program where a frame can vanish uncounted.
    """
    out = {}
    for ns, names in [(lab.bridge_ns, [h.peer for h in lab.hosts]),
                      *[(h.ns, [h.iface]) for h in lab.workers]]:
        with closing(netns.iproute_in(ns)) as ipr:
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME")
                if name in names:
                    out[name] = link.get_attr("IFLA_STATS64")["tx_dropped"]
    return out


def upstream_drops(lab, before: dict, after: dict, senders) -> dict[str, int]:
    """Frames towards the switch dropped by a veth: on the senders' own
    interfaces and on the bridge's port to the switch."""
    names = [h.iface for h in senders] + [lab.switch.peer]
    return {n: after[n] - before[n] for n in names if after[n] != before[n]}


def xdp_frames(lab) -> int:
    """Frames the switch's interface ran through its XDP program (veth's
    per-queue xdp_packets: every frame taken from its rings)."""
    r = netns.run_in(lab.switch.ns, ["ethtool", "-S", lab.switch.iface],
                     capture_output=True, text=True)
    return sum(int(line.split(":")[1]) for line in r.stdout.splitlines()
               if line.strip().startswith("rx_queue_") and "_xdp_packets:" in line)


def quiet_reading(lab, sw, tries: int = 200) -> tuple[int, dict]:
    """(frames through the switch's XDP, switch counters), read in a moment when
    neither moves for 5 ms: veth adds a NAPI poll's frames to xdp_packets when
    the poll ends, while the program counts each frame as it goes, so a reading
    taken during a poll (ARP and control-protocol TCP never stop) is skewed."""
    for _ in range(tries):
        x0, c0 = xdp_frames(lab), switch_counters(sw)
        time.sleep(0.005)
        x1, c1 = xdp_frames(lab), switch_counters(sw)
        if x0 == x1 and c0 == c1:
            return x1, c1
    raise AssertionError("the switch's counters never stood still for 5 ms")


def settle(condition, timeout: float = 3.0) -> bool:
    """Frames still in flight after the workers returned (retransmissions that
    crossed their result) get `timeout` to arrive."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ------------------------------------------------------------------ tensors

def int_tensor(seed, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)


def float_tensor(seed, n: int, rank: int) -> np.ndarray:
    """Per-block magnitudes far apart, a zero block and (rank 1) an infinity,
    so exponents and the non-finite flag travel through the switch."""
    rng = np.random.default_rng(seed)
    nb = -(-n // K)
    scale = (10.0 ** rng.integers(-25, 25, nb)).repeat(K)[:n]
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if n > 3 * K:
        x[K:2 * K] = 0
        if rank == 1:
            x[2 * K + 5] = np.inf
    return x


def wrap_sum(arrays) -> np.ndarray:
    return np.sum(np.stack(arrays).astype(np.int64), axis=0).astype(np.uint32).view(np.int32)


def bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def packets(n: int, dtype=np.int32, slots: int = 0) -> int:
    """Packets of one allreduce of n elements (switchml_xdp/worker/plans.py):
    one a block; float32 first sends a window of exponent-only packets."""
    blocks = -(-n // K)
    return blocks if dtype == np.int32 else blocks + min(slots, blocks)


# ================================================================== (a) loss

LOSS_LEVELS = [0.0, 0.001, 0.01, 0.05]
N_INT, N_FLOAT = 250 * K - 17, 250 * K + 3          # 250 + 251 packets each way, a worker


def _afxdp_reason() -> str | None:
    try:
        from switchml_xdp.worker import afxdp_backend
    except ImportError as e:
        return f"the AF_XDP engine is not built ({e})"
    return afxdp_backend.unavailable_reason()


@pytest.fixture(scope="class", params=["udp", "afxdp"])
def loss_job(request, lab8, switch):
    """A 4-worker job kept for the whole loss matrix of one backend (an afxdp
    worker compiles its redirect program at set-up: ~1.5 s each). afxdp takes
    w0-w3 (one afxdp worker per interface), udp w4-w7."""
    from switchml_xdp import Worker

    backend = request.param
    if backend == "afxdp" and (reason := _afxdp_reason()):
        pytest.skip(reason)
    hosts = lab8.workers[:4] if backend == "afxdp" else lab8.workers[4:8]
    name = job_name(f"loss-{backend}")

    def join(rank, host):
        return Worker(lab8.switch.ip, name, rank, len(hosts), backend=backend, verbose=False,
                      stall_timeout=30)

    t0 = time.monotonic()
    workers = run_ranks(lab8, hosts, join, timeout=120)
    report("loss job set-up", backend=backend, seconds=f"{time.monotonic() - t0:.2f}")
    try:
        yield backend, hosts, workers
    finally:
        lab8.set_loss(0, hosts=lab8.workers, port=PORT)
        run_ranks(lab8, hosts, lambda rank, host: workers[rank].close(), timeout=60)


class TestLossMatrix:
    @pytest.mark.timeout(60)
    @pytest.mark.parametrize("loss", LOSS_LEVELS, ids=lambda p: f"{p:.1%}")
    def test_exact_under_loss_with_consistent_retransmissions(self, lab8, switch, loss_job, loss):
        """4 workers, `loss` on every worker link in both directions.

        Per worker w and per packet, a dropped upstream DATA must be sent
        again; a dropped RESULT (multicast or shadow) too: the first copy of
        w's contribution that arrives never gets a shadow reply, and neither
        does the one whose shadow reply finally arrives, so each of the other
        sends carries at most one drop. Hence
            retransmissions_w >= up_dropped_w + down_dropped_w.
        At the switch every packet index completes once and every worker
        contributes once per index, so everything else that arrived is a
        retransmission answered by a shadow reply or dropped as a duplicate:
            shadow_reply + dup_dropped == rx - world * packets
                                       == sum_w (retransmissions_w - up_dropped_w)
        (the second form when no veth on the way dropped a frame; measured).
        Hence also shadow_reply <= sum_w retransmissions_w.
        """
        backend, hosts, workers = loss_job
        world = len(hosts)
        seed = int(loss * 10000)
        ints = [int_tensor([seed, 1, r], N_INT) for r in range(world)]
        floats = [float_tensor([seed, 2, r], N_FLOAT, r) for r in range(world)]
        npk = packets(N_INT) + packets(N_FLOAT, np.float32, workers[0].info.slots)

        def body(rank, host):
            w = workers[rank]
            a, b = ints[rank].copy(), floats[rank].copy()
            w.allreduce(a)
            w.allreduce(b)
            return a, b

        lab8.set_loss(loss, hosts=hosts, direction="both", port=PORT)
        try:
            c0, l0, s0 = switch_counters(switch), lab8.loss_counters(), [w.stats() for w in workers]
            drops0 = link_drops(lab8)
            t0 = time.monotonic()
            results = run_ranks(lab8, hosts, body, timeout=50)
            elapsed = time.monotonic() - t0
            s1 = [w.stats() for w in workers]
            sent = {h.name: s1[r]["packets_sent"] - s0[r]["packets_sent"] for r, h in enumerate(hosts)}

            def arrived():
                d = loss_delta(l0, lab8.loss_counters())
                return (all(d[h]["up"]["seen"] == sent[h] for h in sent) and
                        cdelta(c0, switch_counters(switch))["rx"] ==
                        sum(d[h]["up"]["passed"] for h in sent))

            settle(arrived)
            c, ld = cdelta(c0, switch_counters(switch)), loss_delta(l0, lab8.loss_counters())
            drops = upstream_drops(lab8, drops0, link_drops(lab8), hosts)
        finally:
            lab8.set_loss(0, hosts=hosts, port=PORT)

        ref_i, ref_f = wrap_sum(ints), quant.simulate_allreduce(floats, K)
        for rank, (a, b) in enumerate(results):
            np.testing.assert_array_equal(a, ref_i, err_msg=f"int32, rank {rank}")
            assert np.array_equal(bits(b), bits(ref_f)), f"float32 not bit-identical, rank {rank}"

        retx = {h.name: s1[r]["retransmissions"] - s0[r]["retransmissions"]
                for r, h in enumerate(hosts)}
        bs = lab8.switch.peer
        for r, h in enumerate(hosts):
            up, down = ld[h.name]["up"], ld[h.name]["down"]
            assert up["seen"] == up["dropped"] + up["passed"] and up["duplicated"] == 0, up
            assert down["seen"] == down["dropped"] + down["passed"], down
            assert sent[h.name] == npk + retx[h.name], (h.name, sent, retx)
            assert s1[r]["results"] - s0[r]["results"] == npk
            # Every frame the worker sent crossed its link's loss hook, but for
            # any its own veth dropped (a full ring under load; measured).
            assert 0 <= sent[h.name] - up["seen"] <= drops.get(h.iface, 0), (h.name, up, drops)
            assert retx[h.name] >= up["dropped"] + down["dropped"], (h.name, retx, up, down)
        up_dropped = sum(ld[h.name]["up"]["dropped"] for h in hosts)
        down_dropped = sum(ld[h.name]["down"]["dropped"] for h in hosts)
        up_passed = sum(ld[h.name]["up"]["passed"] for h in hosts)
        assert c["rx"] == outcome_sum(c), c
        assert not any(c[r] for r in wire.DROP_REASONS), c
        assert c["completed"] == npk and c["aggregated"] == (world - 1) * npk, c
        assert c["shadow_reply"] + c["dup_dropped"] == c["rx"] - world * npk, c
        # What the workers' links passed reached the switch, but for what the
        # bridge's port to the switch dropped (measured; 0 unless the machine
        # is so loaded that softirq work waits for ksoftirqd).
        assert 0 <= up_passed - c["rx"] <= drops.get(bs, 0), (up_passed, c, drops)
        if not drops:
            assert c["rx"] == up_passed
            assert c["shadow_reply"] + c["dup_dropped"] == sum(retx.values()) - up_dropped, (c, retx)
        assert c["shadow_reply"] <= sum(retx.values())
        if loss >= 0.01:   # 1000+ frames each way: some loss is certain (P(none) < 1e-4)
            assert up_dropped > 0 and down_dropped > 0, ld
        if loss == 0:
            assert up_dropped == down_dropped == 0
        report("loss", backend=backend, loss=f"{loss:.1%}", packets_per_worker=npk,
               seconds=f"{elapsed:.2f}", up_dropped=up_dropped, down_dropped=down_dropped,
               retransmissions=sum(retx.values()), shadow_replies=c["shadow_reply"],
               dup_dropped=c["dup_dropped"], veth_drops=drops)


# ================================================================== jobs that keep streaming

class StreamingJob:
    """A job of udp Workers (threads in their hosts' namespaces) that reduce
    tensor after tensor until stop() and at least `min_calls`. The ranks agree
    on every call at a barrier, so they make the same calls in the same order.
    Call i is int32 for even i, float32 for odd i, `n(i)` elements."""

    def __init__(self, lab, hosts, name: str, port: int, seed: int, min_calls: int = 2,
                 size_packets: int = 40):
        self.lab, self.hosts, self.name, self.port, self.seed = lab, hosts, name, port, seed
        self.world, self.min_calls, self.size_packets = len(hosts), min_calls, size_packets
        self.info = None
        self.workers: list = [None] * self.world
        self.joined, self.streaming, self._stop = threading.Event(), threading.Event(), threading.Event()
        self.gate = threading.Event()      # set: the ranks start streaming (start() sets it unless told)
        self._barrier = threading.Barrier(self.world, timeout=60)
        self._go: dict[int, bool] = {}
        self.results = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"job-{name}")

    def n(self, i: int) -> int:
        return self.size_packets * K - 3 + 7 * (i % 5)

    def tensor(self, i: int, rank: int) -> np.ndarray:
        if i % 2 == 0:
            return int_tensor([self.seed, i, rank], self.n(i))
        return float_tensor([self.seed, i, rank], self.n(i), rank)

    def expected(self, i: int) -> np.ndarray:
        xs = [self.tensor(i, r) for r in range(self.world)]
        return wrap_sum(xs) if i % 2 == 0 else quant.simulate_allreduce(xs, K)

    def _body(self, rank, host):
        try:
            return self._stream(rank)
        except BaseException:
            self._barrier.abort()      # the other ranks stop at the barrier instead of waiting
            raise

    def _stream(self, rank):
        from switchml_xdp import Worker

        with Worker(self.lab.switch.ip, self.name, rank, self.world, backend="udp",
                    port=self.port, verbose=False, stall_timeout=30) as w:
            self.workers[rank] = w
            if rank == 0:
                self.info = w.info
                self.joined.set()
            assert self.gate.wait(60), "never told to stream"
            outs, i = [], 0
            while True:
                if self._barrier.wait() == 0:
                    self._go[i] = not (self._stop.is_set() and i >= self.min_calls)
                self._barrier.wait()
                if not self._go[i]:
                    break
                a = self.tensor(i, rank)
                if rank == 0:
                    self.streaming.set()
                w.allreduce(a)
                outs.append(a)
                i += 1
            return outs, w.stats()

    def _run(self):
        try:
            self.results = run_ranks(self.lab, self.hosts, self._body, timeout=120)
        except BaseException as e:  # re-raised by stop()
            self._barrier.abort()
            self.error = e
            self.joined.set()
            self.streaming.set()

    def start(self, gate: bool = True) -> "StreamingJob":
        """Join and start streaming (with gate=False: join, and stream once
        self.gate is set)."""
        if gate:
            self.gate.set()
        self._thread.start()
        return self

    def wait_streaming(self, timeout: float = 60) -> None:
        assert self.streaming.wait(timeout), f"job {self.name} never started streaming"
        if self.error:
            raise self.error

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(150)
        assert not self._thread.is_alive(), f"job {self.name} did not finish"
        if self.error:
            raise self.error

    @property
    def calls(self) -> int:
        return len(self.results[0][0])

    @property
    def npackets(self) -> int:
        return sum(packets(self.n(i), np.int32 if i % 2 == 0 else np.float32, self.info.slots)
                   for i in range(self.calls))

    def packets_sent(self) -> int:
        return sum(stats["packets_sent"] for _, stats in self.results)

    def live_packets_sent(self) -> int:
        """While streaming (read from another thread; the counts only grow)."""
        return sum(w.stats()["packets_sent"] for w in self.workers if w is not None)

    def retransmissions(self) -> int:
        return sum(stats["retransmissions"] for _, stats in self.results)

    def check_exact(self) -> None:
        for i in range(self.calls):
            ref = self.expected(i)
            for rank, (outs, _) in enumerate(self.results):
                if i % 2 == 0:
                    np.testing.assert_array_equal(outs[i], ref, err_msg=f"{self.name} call {i} rank {rank}")
                else:
                    assert np.array_equal(bits(outs[i]), bits(ref)), f"{self.name} call {i} rank {rank}"


# ------------------------------------------------------------------ a model of the data plane

class SwitchModel:
    """What xdp/swml_switch.c does with a frame, in its order of checks, given a
    snapshot of the jobs and members maps: "passed", a drop reason, or
    "accepted" (the packet reaches its slot, and ends as aggregated, completed,
    shadow_reply or dup_dropped depending on the slot's state)."""

    def __init__(self, sw):
        self.port_b = PORT.to_bytes(2, "big")
        self.jobs = self.snapshot(sw)

    @staticmethod
    def snapshot(sw) -> dict[int, tuple]:
        jobs = {}
        with closing(SwitchMaps(sw.iface)) as maps:
            for j in range(wire.MAX_JOBS):
                e = maps.read_job(j)
                if e.active:
                    members = []
                    for r in range(min(e.world, wire.MAX_WORLD)):
                        m = maps.members.lookup(j * wire.MAX_WORLD + r)
                        members.append((m.ip.to_bytes(4, "little"), m.port.to_bytes(2, "little")))
                    jobs[j] = (e.world, e.slot_count, members)
        return jobs

    def udp(self, payload: bytes, length: int, src_ip: bytes, sport: bytes) -> str:
        """A datagram a kernel UDP socket sent to the switch's port (`payload`:
        at least its first 16 bytes, `length` its real length)."""
        return self.swml(payload, length, (28 + length).to_bytes(2, "big"),
                         (8 + length).to_bytes(2, "big"), src_ip, sport)

    def frame(self, f: bytes, n: int) -> str:
        """A whole Ethernet frame of length n (f: at least its first 96 bytes)."""
        if n < 14 or f[12:14] != b"\x08\x00" or n < 34:
            return "passed"
        ihl = f[14] & 0xF
        if f[14] >> 4 != 4 or f[23] != socket.IPPROTO_UDP or ihl < 5:
            return "passed"
        if ihl != 5:
            u = 14 + 4 * ihl
            return "bad_ip" if n >= u + 8 and f[u + 2:u + 4] == self.port_b else "passed"
        if n < 42 or f[36:38] != self.port_b:
            return "passed"
        if int.from_bytes(f[20:22], "big") & 0x3FFF:
            return "bad_ip"
        return self.swml(f[42:58], n - 42, f[16:18], f[38:40], f[26:30], f[34:36])

    def swml(self, h: bytes, plen: int, ip_len: bytes, udp_len: bytes, saddr: bytes,
             sport: bytes) -> str:
        if plen < wire.HDR_LEN:
            return "truncated"
        if h[0] >> 4 != wire.VERSION:
            return "bad_version"
        if h[0] & 0xF != wire.TYPE_DATA:
            return "bad_type"
        if int.from_bytes(h[14:16], "big") != K:
            return "bad_count"
        if plen < PAYLOAD_LEN:
            return "truncated"
        if (int.from_bytes(ip_len, "big") != 28 + PAYLOAD_LEN or
                int.from_bytes(udp_len, "big") != 8 + PAYLOAD_LEN):
            return "bad_ip"
        job = self.jobs.get(int.from_bytes(h[2:4], "big"))
        if job is None:
            return "unknown_job"
        world, slot_count, members = job
        rank = int.from_bytes(h[4:6], "big")
        if rank >= world or rank >= wire.MAX_WORLD:
            return "bad_rank"
        if members[rank] != (saddr, sport):
            return "bad_source"
        if int.from_bytes(h[6:8], "big") >= slot_count:
            return "bad_slot"
        return "accepted"


def udp_socket(lab, host, port: int) -> socket.socket:
    """A UDP socket in host's namespace, bound to `port`, that reports a frame its
    own interface dropped (ENOBUFS, thanks to IP_RECVERR) instead of losing it
    silently, so that a sender can count exactly what left."""
    with lab.enter(host):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
    s.bind(("0.0.0.0", port))
    return s


def raw_socket(lab, host) -> socket.socket:
    with lab.enter(host):
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((host.iface, 0))
    return s


class Pacer:
    """Keeps at most `window` frames to the switch's data port in flight
    between our senders and the switch program. Under load the kernel defers
    softirq work to ksoftirqd, and a sender that outruns it fills the
    256-frame NAPI ring of the switch's veth, which then drops (tx_dropped of
    the bridge's port; seen once on this 2-core machine with benchmarks
    running next to the tests, 1537 frames). In flight = our frames to the
    port + the other senders' (`others()`, live) - the switch's rx since;
    nothing else sends to the port meanwhile, so the estimate is exact but
    for frames the senders have not counted yet. A wait gives up after 0.5 s
    (frames a veth did drop never arrive); the drop then shows in the link
    counters the tests check."""

    def __init__(self, sw, others=lambda: 0, window: int = 64, every: int = 16):
        self.maps = SwitchMaps(sw.iface)
        self.others, self.window, self.every = others, window, every
        self.base, self.others0 = self._rx(), others()
        self.waits = self.gave_up = self.peak = 0

    def _rx(self) -> int:
        return sum(v.value for v in self.maps.counters.lookup(wire.CNT_RX))

    def __call__(self, sent: int) -> None:
        """sent: our frames to the data port so far."""
        if sent % self.every:
            return
        deadline = time.monotonic() + 0.5
        while (inflight := sent + self.others() - self.others0 - (self._rx() - self.base)) > self.window:
            self.peak = max(self.peak, inflight)
            self.waits += 1
            if time.monotonic() > deadline:
                self.gave_up += 1
                return
            time.sleep(0.0002)

    def close(self) -> None:
        self.maps.close()


def send_all(sends, dest, pace=lambda sent: None) -> dict[str, int]:
    """sends: (socket, [buffers], raw?, counts as rx?) in order; pace(frames
    sent so far that count as rx at the switch) is called before each send. A send that did not leave is repeated: ENOBUFS (the local veth's ring was full), EAGAIN (a non-blocking
    socket's buffer was full) and ECONNREFUSED (with IP_RECVERR, an ICMP port
    unreachable that came back for an earlier datagram, e.g. one the fuzzer
    forged with this socket's address, is reported by the next send, which
    then sends nothing). Returns how many of each were repeated."""
    repeated = {}
    rx = 0
    for sock, bufs, raw, is_rx in sends:
        if is_rx:
            pace(rx)
            rx += 1
        while True:
            try:
                if raw:
                    sock.sendmsg(bufs)
                else:
                    sock.sendmsg(bufs, [], 0, dest)
                break
            except OSError as e:
                if e.errno not in (errno.ENOBUFS, errno.EAGAIN, errno.ECONNREFUSED):
                    raise
                name = errno.errorcode[e.errno]
                repeated[name] = repeated.get(name, 0) + 1
                if e.errno != errno.ECONNREFUSED:
                    time.sleep(0.0005)
    return repeated


def ip_bytes(ip: str) -> bytes:
    return socket.inet_aton(ip)


def eth_ip_udp(lab, src_host, src_ip: str, sport: int, payload_len: int) -> bytearray:
    """The 42 bytes of Ethernet | IPv4 | UDP of a datagram to the switch's data
    port, as the kernel would write them (DF, checksum over the IP header)."""
    frame = udp_frame(Endpoint(src_host.mac, src_ip, sport), endpoint(lab.switch, PORT),
                      bytes(payload_len))
    return bytearray(frame[:wire.ETH_LEN + wire.IP_LEN + wire.UDP_LEN])


# ================================================================== (b) isolation

@pytest.mark.timeout(90)
def test_four_concurrent_jobs_all_exact(lab8, switch):
    """Four jobs at once; A and B share host w1 (same IP, different ports)."""
    jobs = [StreamingJob(lab8, [lab8.workers[i] for i in idx], job_name(tag), port, seed, min_calls=4)
            for tag, idx, port, seed in [("iso-a", (0, 1), 48881, 1), ("iso-b", (1, 2, 3), 48882, 2),
                                         ("iso-c", (4, 5), 48883, 3), ("iso-d", (6, 7), 48884, 4)]]
    c0, d0 = switch_counters(switch), link_drops(lab8)
    t0 = time.monotonic()
    for j in jobs:
        j.start()
    for j in jobs:
        j.wait_streaming()
    for j in jobs:
        j.stop()
    elapsed = time.monotonic() - t0
    for j in jobs:
        j.check_exact()
    sent = sum(j.packets_sent() for j in jobs)
    settle(lambda: cdelta(c0, switch_counters(switch))["rx"] == sent)
    c = cdelta(c0, switch_counters(switch))
    drops = upstream_drops(lab8, d0, link_drops(lab8), lab8.workers)
    assert len({j.info.job_id for j in jobs}) == 4
    ranges = sorted((j.info.job_id, j.info.slots) for j in jobs)
    assert c["completed"] == sum(j.npackets for j in jobs), c
    assert c["completed"] + c["aggregated"] == sum(j.world * j.npackets for j in jobs), c
    assert c["rx"] == outcome_sum(c), c
    assert not any(c[r] for r in wire.DROP_REASONS), c
    # Everything the workers sent arrived, but for frames a veth dropped
    # (measured: 9 workers start their windows at once, and under load a
    # NAPI ring of 256 can fill); each of those was sent again.
    assert 0 <= sent - c["rx"] <= sum(drops.values()), (sent, c, drops)
    assert c["shadow_reply"] + c["dup_dropped"] == \
        c["rx"] - sum(j.world * j.npackets for j in jobs), c
    report("four concurrent jobs", seconds=f"{elapsed:.2f}", calls=[j.calls for j in jobs],
           jobs_and_slots=ranges, retransmissions=sum(j.retransmissions() for j in jobs),
           veth_drops=drops)


@pytest.mark.timeout(90)
def test_crafted_packets_from_another_job_change_nothing(lab8, switch):
    """Job A (w0, w1 on port PA; hand-driven sockets) attacks job B (w1, w2, w3
    on port PB; real workers) while B streams: every rank, every slot of B's
    range and two beyond it, both versions, with and without the
    retransmission flag, from A's rank 0 (another host) and from A's rank 1,
    which is B's rank 0 too (same IP, A's port). All dropped before any slot
    is touched: bad_rank for ranks >= B's world, bad_source for the others."""
    from switchml_xdp.worker.control import ControlClient

    PA, PB = 48885, 48886
    hosts_a = lab8.workers[:2]
    peers = [udp_socket(lab8, h, PA) for h in hosts_a]
    name_a = job_name("victim-a")

    def join_a(rank, host):
        c = ControlClient(lab8.switch.ip)
        return c, c.join(name_a, 2, rank, host.ip, PA, host.mac, timeout=20)

    joined_a = run_ranks(lab8, hosts_a, join_a, timeout=40)
    info_a = joined_a[0][1]
    job_b = StreamingJob(lab8, lab8.workers[1:4], job_name("victim-b"), PB, seed=9, min_calls=3,
                         size_packets=60)
    dest = (lab8.switch.ip, PORT)
    try:
        c0, d0 = switch_counters(switch), link_drops(lab8)
        job_b.start()
        job_b.wait_streaming()
        info_b = job_b.info
        assert info_b.job_id != info_a.job_id
        model = SwitchModel(switch)
        evil = np.full(K, 0x01010101, np.int32)
        sends, expect = [], {}
        for peer, host in zip(peers, hosts_a):
            for rank in (0, 1, 2, 3, 63, 64, 65535):
                for slot in [*range(info_b.slots), info_b.slots, 65535]:
                    for flags in (0, wire.FLAG_SLOT_VER, wire.FLAG_RETRANS,
                                  wire.FLAG_SLOT_VER | wire.FLAG_RETRANS):
                        d = wire.datagram(wire.TYPE_DATA, info_b.job_id, rank, slot, slot, evil,
                                          flags=flags, exp=100)
                        why = model.udp(d, len(d), ip_bytes(host.ip), PA.to_bytes(2, "big"))
                        if host == lab8.workers[1] and rank == 0:
                            assert why == "bad_source"   # B's rank 0's own IP, A's port
                        expect[why] = expect.get(why, 0) + 1
                        sends.append((peer, [d], False, True))
        assert set(expect) == {"bad_rank", "bad_source"}, expect
        pacer = Pacer(switch, job_b.live_packets_sent)
        t0 = time.monotonic()
        try:
            repeated = send_all(sends, dest, pacer)
        finally:
            pacer.close()
        attack_s = time.monotonic() - t0
        assert not job_b.results, "B must still be streaming when the attack ends"
        # A's own slots are untouched too: one exact round on A's slot 3.
        v = np.arange(K, dtype=np.int32)
        for peer, host in zip(peers, hosts_a):
            peer.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                            ip_bytes(info_a.group_ip) + ip_bytes(host.ip))
        for r, peer in enumerate(peers):
            peer.sendto(wire.datagram(wire.TYPE_DATA, info_a.job_id, r, 3, 77, (r + 1) * v), dest)
        for peer in peers:
            peer.settimeout(5)
            got = peer.recv(4096)
            assert wire.unpack_header(got)["seq"] == 77
            np.testing.assert_array_equal(np.frombuffer(got, "<i4", offset=wire.HDR_LEN), 3 * v)
        job_b.stop()
    finally:
        job_b._stop.set()
        for c, _ in joined_a:
            c.leave()
            c.close()
        for p in peers:
            p.close()
    job_b.check_exact()
    n_attack = len(sends)
    settle(lambda: cdelta(c0, switch_counters(switch))["rx"] == n_attack + 2 + job_b.packets_sent())
    c = cdelta(c0, switch_counters(switch))
    # The attackers' own veths may refuse a frame (ENOBUFS, sent again); any
    # other drop on the way to the switch would make the counts below inexact.
    drops = upstream_drops(lab8, d0, link_drops(lab8), lab8.workers[:4])
    assert sum(drops.values()) == repeated.get("ENOBUFS", 0), \
        f"frames dropped by a veth on the way to the switch (see Pacer): {drops}"
    for reason in wire.DROP_REASONS:
        assert c[reason] == expect.get(reason, 0), (reason, c, expect)
    # Only B's workers (and A's one valid round) reached a slot.
    assert c["completed"] == job_b.npackets + 1, c
    assert c["aggregated"] == (job_b.world - 1) * job_b.npackets + 1, c
    assert c["shadow_reply"] + c["dup_dropped"] == job_b.retransmissions(), c
    assert c["rx"] == n_attack + 2 + job_b.packets_sent() == outcome_sum(c), c
    report("cross-job attack", packets=n_attack, seconds=f"{attack_s:.2f}", repeated=repeated,
           pacer_waits=pacer.waits, b_calls=job_b.calls, **expect)


# ================================================================== (c) fuzzing

FIELDS = list(wire.HDR_DTYPE.names)  # the swml header fields a fuzz case corrupts
RAW_FIELDS = {  # offset, size of the Ethernet/IPv4/UDP fields a raw frame corrupts
    "ethertype": (12, 2), "ver_ihl": (14, 1), "tos": (15, 1), "tot_len": (16, 2), "id": (18, 2),
    "frag_off": (20, 2), "ttl": (22, 1), "protocol": (23, 1), "ip_check": (24, 2),
    "saddr": (26, 4), "daddr": (30, 4), "sport": (34, 2), "dport": (36, 2),
    "udp_len": (38, 2), "udp_check": (40, 2)}
N_FIELD = 3000          # per field, V and F:            9 x 2 x 3000 = 54,000
N_RANDOM = 25_000       # random bytes, random length:                  25,000
N_RAW_FIELD = 1000      # per raw field and base:       15 x 2 x 1000 = 30,000
                        # + truncations at every offset: 2 x 1041 kernel, 2 x 1069 raw


def headers(rng, n: int, job: int, ranks, slots: int) -> np.ndarray:
    """n valid DATA headers (random slot in range, seq, exp, version flag) as
    an (n, 16) byte matrix."""
    h = np.zeros(n, wire.HDR_DTYPE)
    h["ver_type"], h["flags"], h["job"], h["rank"] = wire.ver_type(wire.TYPE_DATA), \
        rng.integers(4, size=n), job, ranks
    h["slot"], h["seq"] = rng.integers(slots, size=n), rng.integers(2**32, size=n, dtype=np.uint64)
    h["exp"], h["count"] = rng.integers(-20, 20, size=n), K
    return np.frombuffer(h.tobytes(), np.uint8).reshape(n, wire.HDR_LEN).copy()


def corrupt(rng, rows: np.ndarray, off: int, size: int) -> None:
    """Corrupt the big-endian field rows[:, off:off+size] of every row: a random
    value, the valid one with one bit flipped, or an edge (0, all ones, +-1)."""
    n, top = rows.shape[0], (1 << 8 * size) - 1
    shifts = np.arange(size - 1, -1, -1, dtype=np.uint64) * np.uint64(8)
    v = (rows[:, off:off + size].astype(np.uint64) << shifts).sum(axis=1, dtype=np.uint64)
    flip = v ^ (np.uint64(1) << rng.integers(8 * size, size=n).astype(np.uint64))
    edges = np.stack([np.zeros(n, np.uint64), np.full(n, top, np.uint64),
                      (v + np.uint64(1)) & np.uint64(top), (v - np.uint64(1)) & np.uint64(top)])
    edge = edges[rng.integers(4, size=n), np.arange(n)]
    rand = rng.integers(0, top + 1, size=n, dtype=np.uint64)
    pick = rng.integers(4, size=n)
    new = np.where(pick == 0, flip, np.where(pick == 1, edge, rand))
    for b, shift in enumerate(shifts):
        rows[:, off + b] = (new >> shift) & np.uint64(0xFF)


@pytest.mark.timeout(120)
def test_fuzz_switch_keeps_working_and_accounts_for_every_packet(lab8, switch):
    """More than 100k bad, random and mutated packets at the switch while a
    valid 4-worker job streams. Senders: a job F whose two ranks are our own
    sockets (w4, w5), so mutations that keep a valid header reach its slots
    and the lock path; a non-member socket on w6 (mutations of the valid job
    V's packets, random bytes); a raw socket on w7 (corrupted Ethernet/IPv4/UDP
    headers, frames cut at every offset). A model of the switch's checks
    (SwitchModel) predicts, for every packet, whether it counts as rx and why
    it is dropped.

    Exact accounting needs every frame we count as sent to reach the switch
    program: a kernel UDP socket or a raw socket reports a frame its own veth
    could not queue (ENOBUFS, with IP_RECVERR for UDP) and we send it again;
    the only other place a frame can vanish is the bridge's port to the
    switch, whose tx_dropped must stay 0 (measured, not assumed). Should it
    move, the test fails saying so rather than loosening the count."""
    from switchml_xdp import Worker
    from switchml_xdp.worker.control import ControlClient

    w = lab8.workers
    PV, PF, PX = 48890, 48891, 40123
    rng = np.random.default_rng(2024)
    sock_f = [udp_socket(lab8, w[4], PF), udp_socket(lab8, w[5], PF)]
    sock_x = udp_socket(lab8, w[6], PX)
    raw = raw_socket(lab8, w[7])
    for s in sock_f:                       # shadow replies come back: never block on them
        s.setblocking(False)
    name_f = job_name("fuzz-f")

    def join_f(rank, host):
        c = ControlClient(lab8.switch.ip)
        return c, c.join(name_f, 2, rank, host.ip, PF, host.mac, timeout=20)

    joined_f = run_ranks(lab8, w[4:6], join_f, timeout=40)
    info_f = joined_f[0][1]
    valid = StreamingJob(lab8, w[:4], job_name("fuzz-v"), PV, seed=31, min_calls=2, size_packets=60)
    dest = (lab8.switch.ip, PORT)
    try:
        valid.start(gate=False)
        assert valid.joined.wait(60) and valid.info, "the valid job did not join"
        info_v = valid.info
        model = SwitchModel(switch)
        assert info_v.job_id in model.jobs and info_f.job_id in model.jobs

        # --- build every packet, and what the switch must do with it -------------
        t_build = time.monotonic()
        payload = np.arange(K, dtype="<i4").tobytes()
        sends, expect = [], {}

        def expect_(why) -> bool:
            """Count the switch's verdict; True if the frame counts as rx."""
            expect[why] = expect.get(why, 0) + 1
            return why != "passed"

        bases = [  # (socket, its IP and port, job, ranks it sends as, slots of the job)
            (sock_x, w[6].ip, PX, info_v.job_id, lambda n: rng.integers(info_v.world, size=n), info_v.slots),
            (sock_f[0], w[4].ip, PF, info_f.job_id, lambda n: np.zeros(n, int), info_f.slots),
            (sock_f[1], w[5].ip, PF, info_f.job_id, lambda n: np.ones(n, int), info_f.slots),
        ]
        # 1. valid headers with one field corrupted (V's from a stranger, F's from its members)
        for field in FIELDS:
            off, size = wire.HDR_DTYPE.fields[field][1], wire.HDR_DTYPE.fields[field][0].itemsize
            for (sock, ip, sport, job, ranks, slots), n in zip(bases, (N_FIELD, N_FIELD // 2,
                                                                    N_FIELD - N_FIELD // 2)):
                rows = headers(rng, n, job, ranks(n), slots)
                corrupt(rng, rows, off, size)
                blob, src, sp = rows.tobytes(), ip_bytes(ip), sport.to_bytes(2, "big")
                for i in range(0, len(blob), wire.HDR_LEN):
                    h = blob[i:i + wire.HDR_LEN]
                    sends.append((sock, [h, payload], False, expect_(model.udp(h, PAYLOAD_LEN, src, sp))))
        # 2. random bytes of random length (short ones more often), any socket
        for i in range(N_RANDOM):
            sock, ip, sport, *_ = bases[i % 3]
            n = int(rng.integers(0, 65 if i % 2 else 1473))
            data = rng.bytes(n)
            if i % 7 == 0 and n >= 1:      # a valid version/type nibble now and then
                data = bytes([wire.ver_type(wire.TYPE_DATA)]) + data[1:]
            sends.append((sock, [data], False,
                          expect_(model.udp(data, n, ip_bytes(ip), sport.to_bytes(2, "big")))))
        # 3. a valid datagram cut at every offset 0..HDR+4k (the last one whole), and padded
        for sock, ip, sport, job, ranks, slots in bases[:2]:
            whole = headers(rng, 1, job, ranks(1), slots).tobytes() + payload
            for n in [*range(PAYLOAD_LEN + 1), PAYLOAD_LEN + 1, PAYLOAD_LEN + 4, PAYLOAD_LEN + 100]:
                data = (whole + bytes(100))[:n]
                sends.append((sock, [data], False,
                              expect_(model.udp(data, n, ip_bytes(ip), sport.to_bytes(2, "big")))))
        # 4. raw frames: one Ethernet/IPv4/UDP field corrupted; V's packet from w7 and
        #    F's rank-0 packet with w4's address forged, both from w7's interface
        raw_bases = [(w[7].ip, PX, info_v.job_id, 1, info_v.slots),
                     (w[4].ip, PF, info_f.job_id, 0, info_f.slots)]
        for src_ip, sport, job, rank, slots in raw_bases:
            ip_udp = np.frombuffer(bytes(eth_ip_udp(lab8, w[7], src_ip, sport, PAYLOAD_LEN)), np.uint8)
            for field, (off, size) in RAW_FIELDS.items():
                rows = np.hstack([np.tile(ip_udp, (N_RAW_FIELD, 1)),
                                  headers(rng, N_RAW_FIELD, job, rank, slots)])
                corrupt(rng, rows, off, size)
                blob, width = rows.tobytes(), rows.shape[1]
                for i in range(0, len(blob), width):
                    head = blob[i:i + width]
                    sends.append((raw, [head, payload], True,
                                  expect_(model.frame(head + payload[:64], width + len(payload)))))
        # 5. raw frames cut at every offset from the Ethernet header on
        for src_ip, sport, job, rank, slots in raw_bases:
            whole = bytes(eth_ip_udp(lab8, w[7], src_ip, sport, PAYLOAD_LEN)) + \
                headers(rng, 1, job, rank, slots).tobytes() + payload
            for n in range(14, len(whole) + 1):
                sends.append((raw, [whole[:n]], True, expect_(model.frame(whole[:96], n))))
        order = rng.permutation(len(sends))
        sends = [sends[i] for i in order]
        build_s = time.monotonic() - t_build
        n_rx = sum(v for k, v in expect.items() if k != "passed")
        assert len(sends) >= 100_000 and n_rx >= 100_000, (len(sends), expect)

        # --- send them while V streams ----------------------------------------
        x0, c0 = quiet_reading(lab8, switch)
        d0 = link_drops(lab8)
        valid.gate.set()
        valid.wait_streaming()
        pacer = Pacer(switch, valid.live_packets_sent)
        t0 = time.monotonic()
        try:
            repeated = send_all(sends, dest, pacer)
        finally:
            pacer.close()
        send_s = time.monotonic() - t0
        assert not valid.results, "the valid job must still be streaming when the fuzz ends"
        assert SwitchModel.snapshot(switch) == model.jobs, "the jobs changed under the model"
        valid.stop()
    finally:
        valid._stop.set()
        valid.gate.set()
        for c, _ in joined_f:
            c.leave()
            c.close()
        for s in (*sock_f, sock_x, raw):
            s.close()
    valid.check_exact()

    def accounted():
        return cdelta(c0, switch_counters(switch))["rx"] == n_rx + valid.packets_sent()

    settle(accounted)
    drops = upstream_drops(lab8, d0, link_drops(lab8), w[:4])
    # Every frame the switch program saw is counted once, as rx or as passed;
    # read when nothing but background (ARP, TCP) moves.
    x1, c1 = quiet_reading(lab8, switch)
    c = cdelta(c0, c1)
    assert not drops, f"frames dropped by a veth on the way to the switch: {drops}"
    assert x1 - x0 == c["rx"] + c["passed"], (x1 - x0, c)
    assert c["rx"] == outcome_sum(c), c
    assert c["rx"] == n_rx + valid.packets_sent(), (c["rx"], n_rx, valid.packets_sent(), expect)
    for reason in wire.DROP_REASONS:
        assert c[reason] == expect.get(reason, 0), (reason, c, expect)
    assert sum(c[k] for k in OUTCOMES) == expect.get("accepted", 0) + valid.packets_sent(), (c, expect)
    report("fuzz", packets=len(sends), rx=n_rx, build_s=f"{build_s:.2f}", send_s=f"{send_s:.2f}",
           pps=int(len(sends) / send_s), repeated=repeated, pacer_waits=pacer.waits,
           pacer_peak=pacer.peak,
           pacer_gave_up=pacer.gave_up, valid_calls=valid.calls,
           **{k: v for k, v in sorted(expect.items())})

    # --- the switch is still attached and serving --------------------------------
    assert switch.proc.poll() is None, "the switch daemon died"
    link = json.loads(netns.run_in(lab8.switch.ns, ["ip", "-j", "-d", "link", "show",
                                                    switch.iface], capture_output=True,
                                   text=True).stdout)[0]
    assert "xdp" in link and link["xdp"]["prog"]["name"] == "swml_switch", link.get("xdp")
    name = job_name("after-fuzz")
    xs = [int_tensor([77, r], 3 * K + 1) for r in range(2)]

    def fresh(rank, host):
        with Worker(lab8.switch.ip, name, rank, 2, backend="udp", verbose=False) as wk:
            return wk.allreduce(xs[rank].copy())

    for out in run_ranks(lab8, w[6:8], fresh, timeout=60):
        np.testing.assert_array_equal(out, wrap_sum(xs))
