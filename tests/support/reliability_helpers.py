"""Helpers of the reliability tests (test_loss_matrix.py, test_tenants.py,
test_fuzz.py): counter deltas, the lab's link drops, tensors and their
exact sums, and StreamingJob (a job of udp Workers that keeps reducing).

The switch's counters obey
    rx = aggregated + completed + shadow_reply + dup_dropped + sum(drop reasons)
(docs/design-decisions.md); the lab's loss injector counts, per link and
direction, seen = dropped + passed (switchml_xdp/lab/loss.py). Tests compare
counters as deltas.

Lines starting with "[reliability]" are the measurements docs/reliability.md
quotes (run with -s to see them).
"""
from __future__ import annotations

import itertools
import threading
import time
from contextlib import closing

import numpy as np

from switchml_xdp import quant, wire
from switchml_xdp.lab import netns
from switchml_xdp.lab.cluster import run_ranks
from switchml_xdp.switch.maps import SwitchMaps

K = wire.DEFAULT_K
PORT = wire.DEFAULT_PORT
OUTCOMES = ["aggregated", "completed", "shadow_reply", "dup_dropped"]
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
    """Packets of one allreduce of n elements (switchml_xdp/client/plans.py):
    one a block; float32 first sends a window of exponent-only packets."""
    blocks = -(-n // K)
    return blocks if dtype == np.int32 else blocks + min(slots, blocks)


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
        except BaseException as e:  # noqa: BLE001 - re-raised by stop()
            self._barrier.abort()
            self.error = e
            self.joined.set()
            self.streaming.set()

    def start(self, gate: bool = True) -> StreamingJob:
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
