"""Unit-testing the XDP programs of xdp/ without a network: a loaded program is
handed one frame at a time through BPF_PROG_TEST_RUN (switchml_xdp.bpf.prog_test_run)
and the test looks at its verdict, the frame it wrote and its counters.

    require_bpf()                                # skips without root, bcc or BTF
    sw = SwitchTester(k=8)                       # compiles xdp/swml_switch.c once
    job = sw.add_job(world=2)                    # through SwitchMaps, as the daemon does
    assert sw.run(sw.data(job, rank=0, values=v0)).action == Action.DROP
    out = sw.run(sw.data(job, rank=1, values=v1))
    assert out.action == Action.TX and list(sw.result(out).values) == list(v0 + v1)
    assert sw.counters()["completed"] == 1

Each tester owns a unique pin directory under bpf.PIN_ROOT (removed by close()),
so tests never meet a real switch's maps. reset() empties jobs and slots and
restarts the counters from zero, so one compile serves a whole test module.

SwitchOracle(iface) is a SwitchTester compiled and configured like the live
switch on iface (its params, a copy of its jobs and members): outcome(frame)
predicts the live switch's verdict on a frame (the fuzz and tenant tests).
"""
from __future__ import annotations

import ipaddress
import secrets
from contextlib import closing
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import NamedTuple

import numpy as np
import pytest

from frames import Endpoint, UdpFrame, mac_text, parse_udp_frame, udp_frame
from requires import NO_LAB
from switchml_xdp import bpf, wire
from switchml_xdp.client.afxdp_backend import RX_COUNTERS, compile_redirect, set_peer
from switchml_xdp.switch.dataplane import SwitchParams
from switchml_xdp.switch.maps import JobEntry, SwitchMaps, UplinkEntry
from switchml_xdp.switch.state_files import read_state
from switchml_xdp.switch.xdp_dataplane import fill_ports, program_defines


class Action(IntEnum):
    """enum xdp_action (include/uapi/linux/bpf.h)."""
    ABORTED = 0
    DROP = 1
    PASS = 2
    TX = 3
    REDIRECT = 4


class Run(NamedTuple):
    """What one run of the program did: its verdict, and the frame as it left it."""
    action: Action
    frame: bytes


#: The counter rows of a packet that reached a slot.
OUTCOMES = ("aggregated", "completed", "shadow_reply", "dup_dropped")


def assert_accounted(c: dict[str, int]) -> None:
    """rx = aggregated + completed + shadow_reply + dup_dropped + sum(drop reasons)
    (docs/design-decisions.md, "What is ours")."""
    assert c["rx"] == sum(c[name] for name in (*OUTCOMES, *wire.DROP_REASONS)), c


def only(**counts: int) -> dict[str, int]:
    """The whole counter table: these counts, zero elsewhere."""
    assert set(counts) <= set(wire.COUNTER_NAMES)
    return {name: counts.get(name, 0) for name in wire.COUNTER_NAMES}


def require_bpf() -> None:
    """Skip the calling test (or fixture) where programs cannot be loaded: root, bcc, BTF."""
    if NO_LAB:
        pytest.skip(NO_LAB)


# The program-test modules' switch: small frames, readable values; one compile a module.
PROG_K, PROG_SLOTS = 8, 16


class XdpTester:
    """A loaded XDP program, run on frames; closed at the end of a `with`."""

    def __init__(self, prog: bpf.Program):
        self.prog = prog

    def run(self, frame: bytes) -> Run:
        action, out, _ = bpf.prog_test_run(self.prog.fd, frame)
        return Run(Action(action), out)

    def close(self) -> None:
        self.prog.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class Job:
    """A job as the switch's maps hold it; members come from SwitchTester.member()."""
    id: int
    world: int
    slot_base: int
    slot_count: int
    group: Endpoint  # where its RESULTs go: multicast group MAC/IP, result port
    key: int         # its data key
    result_key: bytes = bytes(wire.RESULT_KEY_LEN)  # what its RESULTs are signed with
    auth: int = wire.AUTH_HEADER                    # and over what
    ranks: tuple[int, ...] = ()   # the ranks that send to this box; () = 0..world-1
    uplink: UplinkEntry | None = None   # a rack box's job: its way to the parent
    lanes: int = 1   # slot s's DATA from a member's port + s mod lanes, RESULTs to there

    @property
    def rank_list(self) -> tuple[int, ...]:
        return self.ranks or tuple(range(self.world))


@dataclass(frozen=True)
class Result:
    """A swml datagram taken out of a frame the switch sent."""
    frame: UdpFrame
    header: np.void  # wire.unpack_header's record (fields as in struct swml_hdr)
    values: np.ndarray  # int32, or int16 for a FMT_INT16 header

    @property
    def type(self) -> int:
        return int(self.header["ver_type"]) & 0x0F

    @property
    def version(self) -> int:
        return int(self.header["ver_type"]) >> 4


class SwitchTester(XdpTester):
    """xdp/swml_switch.c specialised for k elements, `slots` slots, `port`
    and `fanout` (as the daemon compiles it), with its maps in a pin
    directory of its own."""

    SWITCH_MAC, SWITCH_IP = "02:5e:00:00:00:01", "10.255.0.1"
    # The ifindex BPF_PROG_TEST_RUN's frames come in on (the loopback device:
    # the run's rx queue): a rack box's uplink in the tree's tests.
    TEST_RUN_IFINDEX = 1

    def __init__(self, k: int = 8, slots: int = 16, port: int = wire.DEFAULT_PORT,
                 ip: str = SWITCH_IP, mac: str = SWITCH_MAC, fanout: str = "multicast",
                 uplink: bool = False, defines: dict[str, object] | None = None):
        """uplink: built as a rack box with an uplink (SWML_UPLINK): its one
        port and its uplink are both the test run's device. defines: more
        compiler defines (a tunable's value for a test)."""
        self.k, self.slots, self.port = k, slots, port
        self.switch = Endpoint(mac, ip, port)
        # SwitchMaps finds an interface's maps by its name: a made-up name, a directory of our own.
        self.pins_name = f"xdptest-{secrets.token_hex(4)}"
        pins = bpf.pin_dir(self.pins_name)
        bpf.ensure_bpffs(pins)
        try:
            extra, defines = defines, program_defines(SwitchParams(k, slots, port), pins, ip, mac,
                                                      fanout)
            super().__init__(bpf.compile_program("swml_switch.c", "swml_switch",
                                                 {**defines, **({"SWML_UPLINK": 1} if uplink else {}),
                                                  **(extra or {})}))
            if uplink:
                fill_ports(self.prog, [self.TEST_RUN_IFINDEX], fanout)
            self.maps = SwitchMaps(self.pins_name, k)
        except BaseException:
            bpf.remove_pins(pins)
            raise
        self._jobs: dict[int, Job] = {}
        self._baseline = self.maps.read_counters()

    def close(self) -> None:
        self.maps.close()
        super().close()
        bpf.remove_pins(bpf.pin_dir(self.pins_name))

    def reset(self) -> None:
        """No jobs, empty slots, counters from zero."""
        for job in self._jobs.values():
            self.maps.clear_job(job.id, max(job.rank_list) + 1)
            if job.uplink is not None:
                self.maps.clear_parent_route(job.uplink.parent_ip, job.uplink.job_id)
        self._jobs.clear()
        self.maps.reset_slots(0, self.slots)
        self._baseline = self.maps.read_counters()

    # --- the control plane's side -----------------------------------------------
    def add_job(self, job_id: int = 1, world: int = 2, slot_base: int = 0,
                slot_count: int = 4, result_port: int = 40000, key: int | None = None,
                auth: int = wire.AUTH_HEADER, ranks: tuple[int, ...] = (),
                uplink: UplinkEntry | None = None, lanes: int = 1) -> Job:
        """A job with every rank registered at member(job, rank), written as
        the daemon writes it (SwitchMaps); `key` its data key (default: random),
        a random result key, RESULTs signed over what `auth` says. In a tree:
        `ranks` the ranks that send to this box (world: their count), and a
        rack box's `uplink`, whose parent's RESULTs are routed to the job;
        its `lanes` (swml_maps.h, lane_mask)."""
        group_ip, group_mac = wire.group_of_job(job_id)
        key = secrets.randbits(64) if key is None else key
        if ranks:
            world = len(ranks)
        job = Job(job_id, world, slot_base, slot_count, Endpoint(group_mac, group_ip, result_port),
                  key, secrets.token_bytes(wire.RESULT_KEY_LEN), auth, tuple(ranks), uplink, lanes)
        mask = sum(1 << r for r in ranks) if ranks else None
        self.maps.write_job(job_id, JobEntry(world, slot_base, slot_count, group_ip, group_mac,
                                             result_port, key, job.result_key, auth, mask, uplink,
                                             lanes))
        if uplink is not None:
            self.maps.write_parent_route(uplink.parent_ip, uplink.job_id, job_id)
        for rank in job.rank_list:
            m = self.member(job, rank)
            self.maps.write_member(job_id, rank, m.ip, m.port)
        self._jobs[job_id] = job
        return job

    @staticmethod
    def member(job: Job, rank: int) -> Endpoint:
        """The address rank `rank` of `job` is registered with (and sends from by default)."""
        hi, lo, r = job.id >> 8, job.id & 0xFF, rank % 240  # ranks past any world: some address
        return Endpoint(f"02:00:00:{hi:02x}:{lo:02x}:{r:02x}", f"10.{hi}.{lo}.{10 + r}", 41000 + r)

    # --- frames ------------------------------------------------------------------
    def data(self, job: Job, rank: int, slot: int = 0, values=None, *, ver: int | None = None,
             rnd: int | None = None, seq: int | None = None, flags: int = 0, exp: int = 0,
             op: int = wire.OP_SUM, tag: int = 0, key: int | None = None, fmt: int = wire.FMT_INT32,
             kind: int = wire.TYPE_DATA, count: int | None = None, ver_type: int | None = None,
             src: Endpoint | None = None, dst: Endpoint | None = None, owner: int = 0,
             pace: int = 0, **breakage) -> bytes:
        """A frame of (job, rank, slot, round) to the switch from the rank's
        registered address (its port + the slot's lane): a DATA packet of `values` (default k ones), as a
        worker streams it: round `rnd` of the slot (default `ver`, else 0) is
        packet rnd * slot_count + slot of the job (its seq), in version rnd % 2.
        `seq`/`ver` given: exactly those. The rest breaks one thing: `key`
        (default the job's), `op`, `fmt`, `tag`, `kind`, `count` (default
        len(values)) and `ver_type` (the header's first byte, whole) in the
        swml header, `owner` (1 + the rank keeping the sum: a shard's),
        `pace` (the call's bytes left, a pace code),
        `src`/`dst` the sender/receiver, `breakage` goes to frames.udp_frame
        (ip_options, frag_off, ip_length, udp_length)."""
        elem = "<i2" if fmt == wire.FMT_INT16 else "<i4"  # the payload's format on the wire
        vals = np.ones(self.k, np.int32) if values is None else np.asarray(values, np.int32)
        rnd = (ver or 0) if rnd is None else rnd
        ver = rnd % 2 if ver is None else ver
        seq = rnd * job.slot_count + slot if seq is None else seq
        header = bytearray(wire.pack_header(kind, job.id, rank, slot, seq,
                                            len(vals) if count is None else count,
                                            flags | (ver & wire.FLAG_SLOT_VER), exp,
                                            key=job.key if key is None else key, tag=tag, op=op,
                                            fmt=fmt, owner=owner, pace=pace))
        if ver_type is not None:
            header[0] = ver_type
        if src is None:
            m = self.member(job, rank)
            src = replace(m, port=m.port + slot % job.lanes)
        return udp_frame(src, dst or self.switch,
                         bytes(header) + vals.astype(elem).tobytes(), **breakage)

    def round(self, job: Job, slot: int, contributions, *, ver: int | None = None,
              rnd: int | None = None, exps=None, flags=None, op: int = wire.OP_SUM,
              tags=None, fmts=None, owner: int = 0) -> Run:
        """Every rank's contribution to round `rnd` (default `ver`) of `slot`,
        rank order; all but the last must be absorbed (XDP_DROP). The last one's Run."""
        assert len(contributions) == job.world
        exps, flags = exps or [0] * job.world, flags or [0] * job.world
        tags = tags or [0] * job.world
        fmts = fmts or [wire.FMT_INT32] * job.world
        for i, (rank, values) in enumerate(zip(job.rank_list, contributions)):
            run = self.run(self.data(job, rank, slot, values, ver=ver, rnd=rnd, exp=exps[i],
                                     flags=flags[i], op=op, tag=tags[i],
                                     fmt=fmts[i], owner=owner))
            if i < job.world - 1:
                assert run.action == Action.DROP, f"rank {rank} of {job.world}: {run.action!r}"
        return run

    @staticmethod
    def result(run: Run) -> Result:
        frame = parse_udp_frame(run.frame)
        header = wire.unpack_header(frame.payload)
        elem = "<i2" if int(header["fmt"]) == wire.FMT_INT16 else "<i4"  # int32 and offset32
        return Result(frame, header, np.frombuffer(frame.payload[wire.HDR_LEN:], elem))

    # --- observation ---------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """Packets by outcome since the last reset(), by wire.COUNTER_NAMES."""
        now = self.maps.read_counters()
        return {name: now[name] - self._baseline[name] for name in wire.COUNTER_NAMES}

    def slot_bytes(self) -> list[bytes]:
        """Every slot's raw contents (its lock word reads 0 between steps)."""
        return [bytes(self.maps.slots.lookup(i)) for i in range(self.slots)]


Members = tuple[tuple[str, int], ...]  # (ip, port) by rank


def job_snapshot(iface: str) -> dict[int, tuple[JobEntry, Members]]:
    """The active jobs and their members in the pinned maps of switch `iface`."""
    def ip(be32: int) -> str:
        return str(ipaddress.IPv4Address(be32.to_bytes(4, "little")))

    def port(be16: int) -> int:
        return int.from_bytes(be16.to_bytes(2, "little"), "big")

    jobs = {}
    with closing(SwitchMaps(iface)) as maps:
        for j in range(wire.MAX_JOBS):
            e = maps.read_job(j)
            if e.active:
                members = (maps.members.lookup(j * wire.MAX_WORLD + r)
                           for r in range(min(e.world, wire.MAX_WORLD)))
                jobs[j] = (JobEntry(e.world, e.slot_base, e.slot_count, ip(e.group_ip),
                                    mac_text(bytes(e.group_mac)),
                                    port(e.result_port),
                                    int.from_bytes(e.key.to_bytes(8, "little"), "big"),
                                    lanes=e.lane_mask + 1),
                           tuple((ip(m.ip), port(m.port)) for m in members))
    return jobs


class SwitchOracle(SwitchTester):
    """The switch program compiled as the live switch on `iface` runs it (its
    k, slots and port) with a copy of its jobs and members (`jobs`, as
    job_snapshot read them): outcome(frame) says what the live switch does
    with a frame, as far as its slots' state does not decide."""

    def __init__(self, iface: str):
        st = read_state(iface)
        params = st["params"]
        super().__init__(params["k"], params["slots"], params["port"], st["ip"], st["mac"])
        self.jobs = job_snapshot(iface)
        for job_id, (entry, members) in self.jobs.items():
            self.maps.write_job(job_id, entry)
            for rank, (ip, port) in enumerate(members):
                self.maps.write_member(job_id, rank, ip, port)
        self._last = self.maps.read_counters()

    #: Rows whose choice depends on the slots' state, which the oracle does not copy.
    SLOT_ROWS = (*OUTCOMES, "stale")

    def outcome(self, frame: bytes) -> str:
        """The counter row the frame moves: "passed", "other_host", a drop
        reason, or "accepted" for the rows that depend on the slot
        (aggregated, completed, shadow_reply, dup_dropped, stale)."""
        self.run(frame)
        now = self.maps.read_counters()
        moved = [n for n in wire.COUNTER_NAMES
                 if n not in ("rx", "disagreed") and now[n] != self._last[n]]
        self._last = now
        assert len(moved) == 1, (moved, frame.hex())
        return "accepted" if moved[0] in self.SLOT_ROWS else moved[0]


class RedirectTester(XdpTester):
    """xdp/swml_redirect.c as a worker at `local` compiles it for a job whose
    RESULTs come from `switch` to `group` (and unicast to `local`); with
    switch None, as it is before the join's reply (nothing set_peer'd).

    Its XSKMAP stays empty (a socket needs a bound AF_XDP ring): there
    bpf_redirect_map returns its fallback, XDP_PASS, so the program's decision
    shows in its counters, not in the verdict."""

    # rows SWML_RX_* of xdp/swml_redirect.c, as the backend names them, without "xdp_"
    COUNTERS = tuple(name.removeprefix("xdp_") for name in RX_COUNTERS)

    def __init__(self, local: Endpoint, group: Endpoint, switch: Endpoint | None,
                 lanes: int = 1):
        self.local, self.group, self.switch = local, group, switch
        super().__init__(compile_redirect(local.port, local.ip, lanes))
        if switch is not None:
            self.set_peer(switch)
        self._baseline = self._read_counters()

    def set_peer(self, switch: Endpoint) -> None:
        """What the worker does with the join's reply."""
        self.switch = switch
        set_peer(self.prog, switch.ip, switch.port, self.group.ip)

    def _read_counters(self) -> dict[str, int]:
        table = self.prog.table("rx_counters")
        return {name: sum(table[table.Key(row)]) for row, name in enumerate(self.COUNTERS)}

    def reset(self) -> None:
        self._baseline = self._read_counters()

    def counters(self) -> dict[str, int]:
        """Frames by decision since the last reset()."""
        now = self._read_counters()
        return {name: now[name] - self._baseline[name] for name in self.COUNTERS}


def vec(*values: int) -> np.ndarray:
    """PROG_K int32 values: those given, then zeros."""
    out = np.zeros(PROG_K, np.int32)
    out[:len(values)] = values
    return out
