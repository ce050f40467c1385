"""Micro-benchmark of the switch program alone: ns per packet of each path of
xdp/swml_switch.c through BPF_PROG_TEST_RUN (no network, no other load).

    sudo .venv/bin/python -m switchml_xdp.bench.switch_micro [--k 64,256] [--passes 7]
        [--src DIR] [--fmt offset32|int32] [--cpus one|split] [--json]

A job of world 2 streams rounds through its slots as workers do: per packet
index, rank 0's contribution (the first of its round: the k values are copied
into the slot) then rank 1's (the last: added, the result copied back into the
packet, the packet rewritten into a RESULT and sent), each frame one test run.
A world-3 job adds the middle path (added, the round not complete). The kernel
times each run (repeat=1, so a few ns of its own timing are in every figure);
a pass is the median over its packets and the figure is the min over passes,
the least disturbed by whatever else the machine runs (docs/performance.md).
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import statistics
import struct
from pathlib import Path

import click
import numpy as np

from .. import bpf, wire
from ..switch.dataplane import SwitchParams
from ..switch.maps import JobEntry, SwitchMaps
from ..switch.xdp_dataplane import program_defines
from .output import echo_rows

XDP_DROP, XDP_TX = 1, 3   # enum xdp_action
ROUNDS = 8  # rounds of every slot a pass
SLOTS = 64
HDR_AT = wire.HEADERS_LEN - wire.HDR_LEN  # the swml header in a frame without IP options
ETH_IP_UDP = struct.Struct("!6s6sH BBHHHBBH4s4s HHHH")  # the headers before it
SEQ_AT = HDR_AT + wire.HDR_DTYPE.fields["seq"][1]
FLAGS_AT = HDR_AT + wire.HDR_DTYPE.fields["flags"][1]
SEQ = struct.Struct("!I")
ALL_CPUS = os.sched_getaffinity(0)


def ipv4_header_checksum(header: bytes) -> int:
    """RFC 1071 over a header whose checksum field is 0."""
    total = int(np.frombuffer(header, ">u2").sum(dtype=np.uint64))
    total = (total & 0xFFFF) + (total >> 16)
    return ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF


class LoadedSwitch:
    """xdp/swml_switch.c for k elements and `slots` slots, compiled as the
    daemon compiles it, its maps pinned in a directory of its own (removed by
    close()), jobs written into them as the daemon writes them."""

    MAC, IP = "02:5e:00:00:00:01", "10.255.0.1"

    def __init__(self, k: int, slots: int, auth: int = wire.AUTH_HEADER):
        self.k, self.slots, self.auth = k, slots, auth
        # SwitchMaps finds a switch's maps by its interface's name: a made-up one.
        self.pins_name = f"swml-micro-{secrets.token_hex(4)}"
        pins = bpf.pin_dir(self.pins_name)
        bpf.ensure_bpffs(pins)
        try:
            self.prog = bpf.compile_program(
                "swml_switch.c", "swml_switch",
                program_defines(SwitchParams(k, slots, wire.DEFAULT_PORT), pins, self.IP, self.MAC))
            self.maps = SwitchMaps(self.pins_name, k)
        except BaseException:
            bpf.remove_pins(pins)
            raise
        self.jobs: list[tuple[int, int]] = []
        self._baseline = self.maps.read_counters()

    def reset(self) -> None:
        """No jobs, empty slots, counters from zero."""
        for job_id, world in self.jobs:
            self.maps.clear_job(job_id, world)
        self.jobs.clear()
        self.maps.reset_slots(0, self.slots)
        self._baseline = self.maps.read_counters()

    def add_job(self, world: int) -> tuple[int, int]:
        """A job over every slot, each rank registered; (its id, its data key)."""
        job_id, key = len(self.jobs) + 1, secrets.randbits(64)
        group_ip, group_mac = wire.group_of_job(job_id)
        self.maps.write_job(job_id, JobEntry(world, 0, self.slots, group_ip, group_mac, 40000, key,
                                             secrets.token_bytes(wire.RESULT_KEY_LEN), self.auth))
        for rank in range(world):
            self.maps.write_member(job_id, rank, *self.member(rank)[1:])
        self.jobs.append((job_id, world))
        return job_id, key

    @staticmethod
    def member(rank: int) -> tuple[str, str, int]:
        """The MAC, IP and UDP port rank `rank` sends from."""
        return f"02:00:00:00:01:{rank:02x}", f"10.0.1.{10 + rank}", 41000 + rank

    def data(self, job: tuple[int, int], rank: int, slot: int, values: np.ndarray, seq: int,
             fmt: int) -> bytearray:
        """Rank `rank`'s DATA frame of `values` for `slot`, packet `seq` of the job."""
        job_id, key = job
        mac, ip, port = self.member(rank)
        payload = wire.datagram(wire.TYPE_DATA, job_id, rank, slot, seq, values,
                                flags=(seq // self.slots) & wire.FLAG_SLOT_VER, key=key, fmt=fmt)
        ip_len = 20 + 8 + len(payload)
        src, dst = ipaddress.IPv4Address(ip).packed, ipaddress.IPv4Address(self.IP).packed
        fields = [wire.mac_to_bytes(self.MAC), wire.mac_to_bytes(mac), 0x0800,
                  0x45, 0, ip_len, 0, 0x4000, 64, 17, 0, src, dst,
                  port, wire.DEFAULT_PORT, ip_len - 20, 0]
        fields[10] = ipv4_header_checksum(ETH_IP_UDP.pack(*fields)[14:34])
        return bytearray(ETH_IP_UDP.pack(*fields) + payload)

    def counters(self) -> dict[str, int]:
        """Packets by outcome since the last reset(), by wire.COUNTER_NAMES."""
        now = self.maps.read_counters()
        return {name: now[name] - self._baseline[name] for name in wire.COUNTER_NAMES}

    def close(self) -> None:
        self.maps.close()
        self.prog.close()
        bpf.remove_pins(bpf.pin_dir(self.pins_name))


def stream(sw: LoadedSwitch, world: int, passes: int, check: bool = True,
           fmt: int = wire.FMT_INT32, split: bool = False) -> dict[str, float]:
    """min over passes of the median ns of each rank's packets (rank 0 first of
    its round, rank world-1 last) in payload format `fmt`; `check`: that the
    program did what the switch must (not for a variant cut down to measure a
    part); `split`: rank r's packets run on CPU r mod the CPUs there are, as
    when workers' flows arrive on different CPUs, so that a slot's accumulators
    move between caches within each round."""
    cpus = sorted(os.sched_getaffinity(0))
    sw.reset()
    job = sw.add_job(world)
    rng = np.random.default_rng(world)
    # Offset binary: what quantized float sums send, each element within
    # [0, 2^(31-L)] (swml_wire.h); int32: any bits.
    top = 2**31 // 4 if fmt == wire.FMT_OFFSET32 else 2**31
    low = 0 if fmt == wire.FMT_OFFSET32 else -2**31
    frames = [[sw.data(job, r, slot, rng.integers(low, top, sw.k, dtype=np.int64)
                       .astype(np.uint32).view(np.int32), seq=slot, fmt=fmt)
               for r in range(world)]
              for slot in range(SLOTS)]
    best = [float("inf")] * world
    seq = 0
    for _ in range(passes):
        ns = [[] for _ in range(world)]
        for _ in range(ROUNDS):
            for slot in range(SLOTS):
                for r in range(world):
                    f = frames[slot][r]
                    SEQ.pack_into(f, SEQ_AT, seq)
                    f[FLAGS_AT] = (seq // SLOTS) & wire.FLAG_SLOT_VER
                    if split:
                        os.sched_setaffinity(0, {cpus[r % len(cpus)]})
                    action, _, dt = bpf.prog_test_run(sw.prog.fd, bytes(f))
                    want = XDP_TX if r == world - 1 else XDP_DROP
                    assert action == want or not check, (r, action)
                    ns[r].append(dt)
                seq += 1
        best = [min(b, statistics.median(x)) for b, x in zip(best, ns)]
    c = sw.counters()
    assert c["completed"] == passes * ROUNDS * SLOTS or not check, c
    return {"first": best[0], "last": best[-1], **({"middle": best[1]} if world > 2 else {})}


@click.command()
@click.option("--k", "ks", default="64,256", show_default=True,
              help="elements a packet, comma-separated")
@click.option("--passes", default=7, show_default=True, type=click.IntRange(1, 100))
@click.option("--src", type=click.Path(exists=True, file_okay=False), default=None,
              help="compile the switch from this copy of xdp/ (a variant to compare)")
@click.option("--fmt", type=click.Choice(["int32", "offset32"]), default="offset32",
              show_default=True,
              help="payload format: offset32 is what float32 sums send, int32 what int32 "
                   "tensors and MIN/MAX send")
@click.option("--cpus", type=click.Choice(["one", "split"]), default="one", show_default=True,
              help="run every packet on one CPU, or each rank's on its own CPU (a slot's "
                   "accumulators then move between the CPUs' caches every round)")
@click.option("--auth", type=click.Choice(["header", "full"]), default="header",
              show_default=True,
              help="what the RESULT's authenticator covers (swml-switch up --auth)")
@click.option("--json", "as_json", is_flag=True)
def main(ks, passes, src, fmt, cpus, auth, as_json):
    """ns per packet of each path of the switch program (BPF_PROG_TEST_RUN; root)."""
    if src:
        from ..bpf import compile as bpf_compile
        bpf_compile.xdp_dir = lambda: Path(src).resolve()
    rows = []
    for k in (int(x) for x in ks.split(",")):
        sw = LoadedSwitch(k=k, slots=SLOTS,
                          auth=wire.AUTH_FULL if auth == "full" else wire.AUTH_HEADER)
        try:
            code = wire.FMT_OFFSET32 if fmt == "offset32" else wire.FMT_INT32
            split = cpus == "split"
            two = stream(sw, 2, passes, not src, code, split)
            three = stream(sw, 3, passes, not src, code, split)
        finally:
            os.sched_setaffinity(0, ALL_CPUS)
            sw.close()
        rows.append({"k": k, "first_ns": two["first"], "middle_ns": three["middle"],
                     "last_ns": two["last"], "world2_mean_ns": (two["first"] + two["last"]) / 2})
    echo_rows(rows, as_json,
              f"{'k':>4} {'first':>7} {'middle':>7} {'last':>7} {'world-2 mean':>13}  (ns/packet)",
              lambda r: f"{r['k']:>4} {r['first_ns']:>7.0f} {r['middle_ns']:>7.0f} "
                        f"{r['last_ns']:>7.0f} {r['world2_mean_ns']:>13.0f}",
              "BPF_PROG_TEST_RUN, one run a frame; min over passes of the median of a pass. "
              "first: copy in; middle: add; last: add, copy out, RESULT.")

if __name__ == "__main__":
    main()
