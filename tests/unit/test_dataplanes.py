"""The switch's data planes behind one interface, without a kernel: the
interface's methods, the job table over in-memory maps, the daemon's argument
checks. The daemon itself in the lab: tests/lab/test_daemon.py."""
from __future__ import annotations

import inspect
import subprocess

import pytest

from clis import SWITCH_CLI
from switchml_xdp import wire
from switchml_xdp.switch.daemon import DATAPLANES, SwitchError, make_dataplane
from switchml_xdp.switch.dataplane import Dataplane, SwitchParams
from switchml_xdp.switch.jobs import JobTable
from switchml_xdp.switch.maps import DataplaneMaps, SwitchMaps
from switchml_xdp.switch.userspace import MemoryMaps


@pytest.mark.parametrize("args, reason", [
    (["--elements", "0"], "--elements"),
    (["--elements", str(wire.MAX_K + 1)], "--elements"),
    (["--slots", "0"], "--slots"),
    (["--mode", "offload"], "--mode"),
])
def test_bad_arguments_get_one_line_reasons(args, reason):
    r = subprocess.run(SWITCH_CLI + ["up", "lo"] + args, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and reason in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("Error:")


@pytest.mark.parametrize("name", list(DATAPLANES))
def test_each_dataplane_implements_the_interface(name):
    cls = DATAPLANES[name]
    assert issubclass(cls, Dataplane) and not inspect.isabstract(cls) and cls.name == name
    dp = make_dataplane(name, "lo", SwitchParams())
    assert dp.maps is None and dp.state()["dataplane"] == name
    for maps_cls in (SwitchMaps, MemoryMaps):
        assert issubclass(maps_cls, DataplaneMaps) and not inspect.isabstract(maps_cls)


def test_mode_is_for_xdp_only():
    with pytest.raises(SwitchError, match="--mode is the XDP data plane's"):
        make_dataplane("userspace", "lo", SwitchParams(), "native")
    r = subprocess.run(SWITCH_CLI + ["up", "lo", "--dataplane", "userspace", "--mode", "generic"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and r.stderr.startswith("Error: --mode is the XDP data plane's")


def test_job_table_drives_the_in_memory_maps():
    """What the daemon writes through DataplaneMaps lands where the C loop reads it."""
    maps = MemoryMaps(k=8, slots=64)
    table = JobTable(maps, 8, 64, 16)
    maps.vals[:] = 7  # an earlier job's leftovers
    job = table.join({"job": "j", "world": 2, "rank": 0, "port": 47000, "ip": "10.0.0.11"}, None, "10.0.0.11")
    # A joining job holds no id, no slots, nothing in the data plane.
    assert job.id is None and job.slot_base is None and table.pool.free == 64
    assert not any(maps.job_active(i) for i in range(1, wire.MAX_JOBS))
    table.join({"job": "j", "world": 2, "rank": 1, "port": 47000, "ip": "10.0.0.12"}, None, "10.0.0.12")
    assert not maps.vals[job.slot_base:job.slot_base + 16].any()
    row = maps.jobs[job.id]
    assert maps.job_active(job.id) and row["world"] == 2 and row["slot_count"] == 16
    assert maps.members[job.id * wire.MAX_WORLD + 1]["ip"] == wire.ip_to_be32("10.0.0.12")
    table.leave(job, 0)
    table.leave(job, 1)
    assert not maps.job_active(job.id) and not maps.members[job.id * wire.MAX_WORLD + 1]["ip"]
    assert set(maps.read_counters()) == set(wire.COUNTER_NAMES)
