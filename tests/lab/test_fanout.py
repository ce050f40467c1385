"""Unicast fan-out (`swml-switch up --fanout unicast`): RESULTs for networks
without multicast (docs/design-decisions.md, "Unicast fan-out").

The lab stands in for a cloud VPC with Lab(multicast=False): the switch's
bridge port drops every frame the switch sends to an IPv4 multicast group
(xdp/lab/swml_pass.c). There a job of two workers (one afxdp, one udp) is exact
with unicast fan-out, its RESULTs arriving as first copies, not as shadow
replies; without it, no RESULT arrives but as a shadow reply to a
retransmission. The mode is in the state file, `status --json`, the join
reply; the tc filter goes with the switch (on exit, and by `down` after a
crash). One lab for the whole module.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from requires import NO_LAB

pytestmark = pytest.mark.skipif(NO_LAB is not None, reason=NO_LAB or "")

try:
    from switchml_xdp import _engine  # noqa: F401 - imported only to learn whether it is there
except ImportError as e:  # pragma: no cover - the build failed or was skipped
    pytest.skip(f"the AF_XDP engine is not built: {e}", allow_module_level=True)

BACKENDS = ("afxdp", "udp")        # rank 0, rank 1
N = 20_000                         # float32 elements: ~80 packets at k=256
FIRST_COPY_SHARE = 0.9             # of accepted results, with unicast fan-out
FANOUT_PROG = "swml_fanout"


@pytest.fixture(scope="module")
def lab():
    from switchml_xdp.lab import Lab

    with Lab(workers=len(BACKENDS), multicast=False) as lab:
        yield lab


def inputs(seed: int) -> list[np.ndarray]:
    return [np.random.default_rng([seed, r]).standard_normal(N).astype(np.float32)
            for r in range(len(BACKENDS))]


def reduce_in(lab, job: str, data: list[np.ndarray], stall_timeout: float = 20, during=None):
    """Every rank allreduces its array; per rank (result, stats, join info) or
    the exception. `during`: rank 0 calls it after the allreduce, while the job
    is still running (every rank then allreduces once more to hold it)."""
    from switchml_xdp import Worker
    from switchml_xdp.lab.cluster import run_ranks

    def body(rank, host):
        try:
            with Worker(lab.switch.ip, job, rank, len(BACKENDS), backend=BACKENDS[rank],
                        verbose=False, stall_timeout=stall_timeout) as w:
                x = data[rank].copy()
                w.allreduce(x)
                stats = w.stats()
                if during is not None:
                    if rank == 0:
                        during()
                    w.allreduce(np.zeros(1, np.float32))
                return x, stats, w.info
        except (TimeoutError, RuntimeError) as e:
            return e

    return run_ranks(lab, lab.workers, body, timeout=120)


def switch_cli(lab, *args) -> subprocess.CompletedProcess:
    return lab.run(lab.switch, [sys.executable, "-m", "switchml_xdp.cli.switch", *args],
                   check=False)


def fanout_filter(lab):
    from switchml_xdp import bpf

    return bpf.tc_attachment(lab.switch.iface, netns=lab.switch.ns)


def test_unicast_fanout_is_exact_where_the_network_has_no_multicast(lab):
    from switchml_xdp import quant
    from switchml_xdp.lab.cluster import SwitchProcess
    from switchml_xdp.switch.state_files import read_state

    data = inputs(31)
    expected = quant.simulate_allreduce(data, 256)
    with SwitchProcess(lab, ["--fanout", "unicast"]) as sw:
        assert "fanout unicast" in sw.ready_line
        assert read_state(sw.iface)["fanout"] == "unicast"
        assert fanout_filter(lab).name == FANOUT_PROG
        running = []  # status while the job runs: --json, then text
        per_rank = reduce_in(lab, "uni", data, during=lambda: running.extend(
            switch_cli(lab, "status", *json_arg, "--interval", "0").stdout
            for json_arg in (["--json"], [])))
        running_json, running_text = running
        status = json.loads(switch_cli(lab, "status", "--json", "--interval", "0").stdout)
    assert fanout_filter(lab) is None, "the switch's exit left its tc filter"

    for rank, out in enumerate(per_rank):
        assert not isinstance(out, BaseException), f"rank {rank} ({BACKENDS[rank]}): {out!r}"
        x, stats, info = out
        assert info.fanout == "unicast", "the join reply says how RESULTs come"
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32)), f"rank {rank}"
        first_copies = stats["results"] - stats["shadow_replies"]
        assert first_copies >= FIRST_COPY_SHARE * stats["results"], (
            f"rank {rank} ({BACKENDS[rank]}): only {first_copies} of {stats['results']} results "
            f"came as the switch's unicast copies, the rest as shadow replies: {stats}")
    (st,) = [s for s in status["switches"] if s["iface"] == lab.switch.iface]
    assert st["fanout"] == "unicast"
    c = st["counters"]
    assert c["unicast_copies"] == len(BACKENDS) * c["completed"] > 0, c
    assert c["unicast_no_mac"] == c["unicast_clone_failed"] == c["unicast_no_meta"] == 0, c
    # While the job ran, status showed where each rank's RESULTs go: the MAC
    # the switch learnt from its packets (here its own interface's).
    (st,) = [s for s in json.loads(running_json)["switches"] if s["iface"] == lab.switch.iface]
    (job,) = [j for j in st["jobs"] if j["name"] == "uni"]
    for rank, host in enumerate(lab.workers):
        assert job["members"][str(rank)]["learnt_mac"] == host.mac.lower(), job["members"]
        assert f"RESULTs to {host.mac.lower()}" in running_text, running_text


def test_without_unicast_fanout_results_come_only_as_shadow_replies(lab):
    """The control: the same network with the default (multicast) fan-out.
    No RESULT crosses the bridge by multicast; what the workers get are the
    switch's unicast answers to their retransmissions (or nothing before the
    stall timeout)."""
    from switchml_xdp.lab.cluster import SwitchProcess
    from switchml_xdp.switch.state_files import read_state

    data = [a[:2560] for a in inputs(32)]   # 10 packets: each waits for a retransmission
    with SwitchProcess(lab) as sw:
        assert read_state(sw.iface)["fanout"] == "multicast"
        assert fanout_filter(lab) is None
        per_rank = reduce_in(lab, "multi", data, stall_timeout=10)

    for rank, out in enumerate(per_rank):
        if isinstance(out, BaseException):
            continue   # stalled: nothing came at all
        _, stats, info = out
        assert info.fanout == "multicast"
        assert stats["results"] > 0 and stats["shadow_replies"] == stats["results"], (
            f"rank {rank} ({BACKENDS[rank]}) got RESULTs by multicast through a bridge that "
            f"carries none: {stats}")
        assert stats["retransmissions"] > 0, stats


def crash(sw) -> None:
    sw.proc.send_signal(signal.SIGKILL)
    sw.proc.wait(10)


def test_a_restarted_switch_keeps_the_mode_and_down_removes_the_filter_after_a_crash(lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(lab, ["--fanout", "unicast"]) as sw:
        crash(sw)
        assert fanout_filter(lab) is not None, "the data plane must outlive its daemon"
        status = switch_cli(lab, "status")
        assert "fanout unicast" in status.stdout, status.stdout
        # A new daemon without --fanout takes over the running data plane as it is.
        # (Crashed, not stopped: SwitchProcess.stop() would clean up after it.)
        again = SwitchProcess(lab)
        assert "fanout unicast" in again.ready_line, again.ready_line
        crash(again)
        down = switch_cli(lab, "down", sw.iface)
        assert down.returncode == 0, down.stderr
        assert "fan-out" in down.stdout, down.stdout
        assert fanout_filter(lab) is None


def test_a_switch_restarted_with_multicast_removes_the_filter(lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    with SwitchProcess(lab, ["--fanout", "unicast"]) as sw:
        crash(sw)
        with SwitchProcess(lab, ["--fanout", "multicast"]) as again:
            assert "fanout multicast" in again.ready_line, again.ready_line
            assert fanout_filter(lab) is None


def test_fanout_unicast_needs_the_xdp_data_plane(lab):
    out = switch_cli(lab, "up", lab.switch.iface, "--dataplane", "userspace", "--fanout", "unicast")
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        "Error: --fanout unicast needs the xdp data plane; the userspace data plane sends "
        "RESULTs by multicast only")


def test_unicast_fanout_sends_each_lane_s_copies_to_its_port(lab):
    """A job with lanes (docs/performance.md, "Several queues per worker"):
    the tc fan-out copies a slot's RESULT to each member's port + the slot's
    lane, so each lane's socket takes its RESULTs as the switch's copies."""
    from switchml_xdp import Worker, quant
    from switchml_xdp.lab.cluster import SwitchProcess, run_ranks

    data = inputs(37)
    expected = quant.simulate_allreduce(data, 256)

    def body(rank, host):
        with Worker(lab.switch.ip, "uni-lanes", rank, len(BACKENDS), backend="udp", verbose=False,
                    stall_timeout=20, lanes=2) as w:
            x = data[rank].copy()
            w.allreduce(x)
            return x, w.stats(), [e.stats() for e in w._backend._engines]

    with SwitchProcess(lab, ["--fanout", "unicast"]):
        per_rank = run_ranks(lab, lab.workers, body, timeout=120)
    for x, _, lanes in per_rank:
        assert np.array_equal(x.view(np.uint32), expected.view(np.uint32))
        for lane in lanes:
            first_copies = lane["results"] - lane["shadow_replies"]
            assert lane["results"] > 0 and first_copies >= FIRST_COPY_SHARE * lane["results"], lanes
