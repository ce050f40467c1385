"""Run the product's XDP programs on crafted frames through BPF_PROG_TEST_RUN:
no interface, no namespace, no lab; one frame in, the verdict and the frame
the program made of it out (after katran's XdpTester).

    sw = SwitchTester(k=8, slots=16)              # compiles once (~1.5 s): share per module
    sw.add_job(1, world=2, slot_base=0, slot_count=4, members=[WORKER0, WORKER1])
    run = sw.run(frame)
    run.action     -> "drop" | "pass" | "tx" | "redirect" | "aborted"
    run.frame      -> the frame after the program (rewritten for XDP_TX)
    run.counted    -> {"rx", "aggregated"}: counter rows this frame moved

A new data-plane rule gets its test here first: build the frame with
tests/frames.py, run it, assert the verdict, the counters and the output.
"""
from __future__ import annotations

import ctypes as ct
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pytest

from switchml_xdp import bpf, wire
from switchml_xdp.bpf.libbpf import lib as libbpf

ACTIONS = {0: "aborted", 1: "drop", 2: "pass", 3: "tx", 4: "redirect"}  # enum xdp_action
MAX_FRAME = 4096


class _TestRunOpts(ct.Structure):
    """struct bpf_test_run_opts of libbpf 1.x (sized: libbpf reads no further)."""
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("ctx_in", ct.c_void_p), ("ctx_out", ct.c_void_p),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


def skip_unless_bpf() -> None:
    """Skip the calling test module where programs cannot be loaded."""
    if os.geteuid() != 0:
        pytest.skip("loading XDP programs needs root", allow_module_level=True)
    try:
        import bcc  # noqa: F401
    except ImportError:
        pytest.skip("bcc is not importable (Debian package python3-bpfcc)", allow_module_level=True)


@dataclass(frozen=True)
class Run:
    action: str
    frame: bytes
    counted: frozenset[str]


class XdpTester:
    """A loaded XDP program and a way to read its counters (name -> total)."""

    def __init__(self, program: bpf.Program, counters: Callable[[], Mapping[str, int]]):
        self.program = program
        self._counters = counters
        fn = libbpf().bpf_prog_test_run_opts
        fn.argtypes, fn.restype = [ct.c_int, ct.POINTER(_TestRunOpts)], ct.c_int
        self._test_run = fn

    def counters(self) -> dict[str, int]:
        return dict(self._counters())

    def run(self, frame: bytes) -> Run:
        before = self.counters()
        data_in = ct.create_string_buffer(bytes(frame), len(frame))
        data_out = ct.create_string_buffer(MAX_FRAME)
        opts = _TestRunOpts(sz=ct.sizeof(_TestRunOpts), data_in=ct.addressof(data_in),
                            data_out=ct.addressof(data_out), data_size_in=len(frame),
                            data_size_out=MAX_FRAME, repeat=1)
        ret = self._test_run(self.program.fd, ct.byref(opts))
        if ret < 0:
            raise OSError(-ret, f"BPF_PROG_TEST_RUN: {os.strerror(-ret)}")
        after = self.counters()
        return Run(ACTIONS.get(opts.retval, str(opts.retval)), data_out.raw[:opts.data_size_out],
                   frozenset(n for n, v in after.items() if v != before.get(n, 0)))

    def close(self) -> None:
        self.program.close()


class SwitchTester(XdpTester):
    """xdp/swml_switch.c with its maps pinned in a bpffs directory of its own
    (removed at close), written through SwitchMaps as the daemon writes them."""

    def __init__(self, k: int = 8, slots: int = 16, port: int = wire.DEFAULT_PORT):
        from switchml_xdp.switch.maps import SwitchMaps

        self.k, self.slots, self.port = k, slots, port
        self.iface = f"xdptest-{os.getpid()}-{id(self):x}"  # a pin directory, no interface
        pins = bpf.pin_dir(self.iface)
        bpf.ensure_bpffs(pins)
        try:
            program = bpf.compile_program("swml_switch.c", "swml_switch", {
                "SWML_K": k, "SWML_SLOTS": slots, "SWML_PORT": port,
                "SWML_PIN_DIR": bpf.c_string(pins)})
        except BaseException:
            bpf.remove_pins(pins)
            raise
        self.maps = SwitchMaps(self.iface, k)
        super().__init__(program, self.maps.read_counters)

    def add_job(self, job_id: int, world: int, slot_base: int, slot_count: int,
                members: Iterable, result_port: int = 40000) -> None:
        """A job as the control plane writes it at join; `members` are Hosts by rank."""
        from switchml_xdp.switch.maps import JobEntry

        group_ip, group_mac = wire.group_of_job(job_id)
        self.maps.write_job(job_id, JobEntry(world, slot_base, slot_count, group_ip, group_mac,
                                             result_port))
        for rank, host in enumerate(members):
            self.maps.write_member(job_id, rank, host.ip, host.port)

    def slot_bytes(self, index: int) -> bytes:
        """The raw map value of slot `index` (to show a frame left it alone)."""
        return bytes(self.maps.slots.lookup(index))

    def reset(self) -> None:
        """No jobs, empty slots: each test starts from a fresh switch."""
        for job_id in range(1, wire.MAX_JOBS):
            if self.maps.job_active(job_id):
                self.maps.clear_job(job_id, wire.MAX_WORLD)
        self.maps.reset_slots(0, self.slots)

    def close(self) -> None:
        self.maps.close()
        super().close()
        bpf.remove_pins(bpf.pin_dir(self.iface))


class RedirectTester(XdpTester):
    """xdp/swml_redirect.c for a worker at `local_ip` in the job of `group_ip`.
    No AF_XDP socket sits in its XSKMAP, so a redirect falls back to XDP_PASS:
    the rx_counters rows ("redirected", "passed") tell the two apart."""

    ROWS = ("redirected", "passed")  # SWML_RX_* of swml_redirect.c

    def __init__(self, local_ip: str, group_ip: str, port: int):
        program = bpf.compile_program("swml_redirect.c", "swml_redirect", {
            "SWML_PORT": port, "SWML_LOCAL_IP": wire.ip_to_be32(local_ip),
            "SWML_GROUP_IP": wire.ip_to_be32(group_ip)})
        table = program.table("rx_counters")
        super().__init__(program, lambda: {name: table.sum(table.Key(i)).value
                                           for i, name in enumerate(self.ROWS)})
