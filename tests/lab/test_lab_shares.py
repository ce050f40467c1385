"""Shares between jobs end to end on the XDP switch (docs/operations.md,
"Shares between jobs"): `swml-switch up --share weighted` divides the box
between two running jobs by their weights, the operator's `job` request
changes a weight within a second, and bad requests change nothing. A lab
of its own (the policy is the daemon's, not the session switch's)."""
from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest

from requires import NO_LAB

if NO_LAB:
    pytest.skip(NO_LAB, allow_module_level=True)

from switchml_xdp import wire
from switchml_xdp.switch.state_files import read_operator_token

CAPACITY = 100_000_000


@pytest.fixture(scope="module")
def shares_lab():
    from switchml_xdp.lab import Lab
    from switchml_xdp.lab.cluster import SwitchProcess

    with Lab(workers=4) as lab, SwitchProcess(lab, ["-k", "256", "--share", "weighted",
                                                     "--capacity", "100M",
                                                     "--max-weight", "4"]) as sw:
        yield lab, sw


def control(lab, msg: dict) -> dict:
    """One request on the switch's control port, from a worker's namespace."""
    with lab.enter(lab.workers[0]), socket.create_connection(
            (lab.switch.ip, wire.DEFAULT_CONTROL_PORT), timeout=5) as s:
        s.sendall(json.dumps(msg).encode() + b"\n")
        return json.loads(s.makefile().readline())


def shares_of(lab) -> dict[str, dict]:
    return {j["name"]: j["share"] for j in control(lab, {"op": "status"})["jobs"] if "share" in j}


def stream(lab, job: str, hosts, stop: threading.Event, errors: list) -> list[threading.Thread]:
    """Ranks of `job` on `hosts` allreducing 1 MiB until `stop`."""
    from switchml_xdp import Worker

    def rank_body(rank, host):
        try:
            with lab.enter(host), Worker(lab.switch.ip, job, rank, len(hosts), backend="udp",
                                         verbose=False, stall_timeout=30) as w:
                x = np.ones(1 << 18, np.float32)
                while not stop.is_set():
                    w.allreduce(x)
        except Exception as e:   # noqa: BLE001 - reported by the test
            errors.append(f"{job} rank {rank}: {e}")

    threads = [threading.Thread(target=rank_body, args=(r, h), daemon=True)
               for r, h in enumerate(hosts)]
    for t in threads:
        t.start()
    return threads


def wait_for(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout:g} s")


@pytest.mark.timeout(120)
def test_weights_divide_the_box_and_the_operator_changes_them(shares_lab):
    lab, sw = shares_lab
    token = read_operator_token(sw.iface)
    stop, errors = threading.Event(), []
    threads = (stream(lab, "heavy", lab.workers[:2], stop, errors)
               + stream(lab, "light", lab.workers[2:4], stop, errors))
    try:
        wait_for(lambda: len(shares_of(lab)) == 2, 30, "both jobs running under shares")
        reply = control(lab, {"op": "job", "operator": token, "job": "heavy", "weight": 3})
        assert reply == {"ok": True, "op": "job", "job": "heavy", "weight": 3.0, "dscp": None}
        t0 = time.monotonic()
        s = wait_for(lambda: (lambda s: s if s["heavy"]["share"] == 0.75 else None)(shares_of(lab)),
                     1.0, "weight 3:1 in the shares")
        assert time.monotonic() - t0 < 1.0
        assert s["light"]["share"] == 0.25 and s["heavy"]["weight"] == 3.0
        assert s["heavy"]["target_bps"] == 0.75 * CAPACITY
        # In the data plane: each of heavy's 2 ranks may send 37.5 Mbit/s.
        from switchml_xdp.switch.maps import SwitchMaps

        maps = SwitchMaps(sw.iface)
        try:
            ids = {j["name"]: j["id"] for j in control(lab, {"op": "status"})["jobs"]}
            code = socket.ntohs(maps.job_pace.lookup(ids["heavy"]).rate)   # __be16
        finally:
            maps.close()
        assert wire.pace_decode(code) == wire.pace_decode(wire.pace_encode(37_500))
        assert s["heavy"]["actual_bps"] > 0 and s["light"]["actual_bps"] > 0
        # Bad requests: one line each, nothing changed.
        for bad, words in [({"operator": "0" * 32, "weight": 1}, "operator"),
                           ({"operator": token, "weight": 0}, "above zero"),
                           ({"operator": token, "weight": -1}, "above zero"),
                           ({"operator": token, "weight": "x"}, "above zero"),
                           ({"operator": token, "weight": 5}, "cap"),
                           ({"operator": token, "weight": 1, "job": "nobody"}, "no job")]:
            reply = control(lab, {"op": "job", "job": "heavy", **bad})
            assert reply["ok"] is False and "\n" not in reply["error"], reply
            assert words in reply["error"], reply
        assert shares_of(lab)["heavy"]["weight"] == 3.0
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
