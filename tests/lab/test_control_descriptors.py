"""docs/security.md, the control plane: connections to the control port from
many addresses cannot take the daemon's descriptors. A daemon held to 200
descriptors takes 128 idle connections (the per-address cap) from each of
two hosts: at its share (descriptors.py) it stops accepting, the connections
beyond wait in the kernel's backlog, the daemon keeps descriptors of its
own and logs one line, no traceback; a client that waited is answered as
soon as the attackers let go, and a job then joins and completes at once.
"""
from __future__ import annotations

import json
import os
import resource
import socket
import time

import numpy as np
import pytest

from half_open import half_open
from lab_jobs import run_job
from switchml_xdp import wire
from switchml_xdp.switch.control import MAX_CONNECTIONS_PER_IP
from switchml_xdp.switch.descriptors import RESERVED

DAEMON_NOFILE = 200


@pytest.mark.lab_workers(4)
def test_connections_from_many_addresses_leave_the_daemon_its_descriptors(fresh_lab):
    from switchml_xdp.lab.cluster import SwitchProcess

    lab = fresh_lab
    cap = DAEMON_NOFILE - RESERVED
    with SwitchProcess(lab, []) as sw:
        resource.prlimit(sw.proc.pid, resource.RLIMIT_NOFILE, (DAEMON_NOFILE, DAEMON_NOFILE))
        socks = []
        try:
            for host in lab.workers[2:4]:
                socks += half_open(lab, host, wire.DEFAULT_CONTROL_PORT, MAX_CONNECTIONS_PER_IP)
            time.sleep(1.0)
            held = len(os.listdir(f"/proc/{sw.proc.pid}/fd"))
            assert held <= cap + RESERVED // 2, f"the daemon holds {held} of {DAEMON_NOFILE}"
            with lab.enter(lab.workers[0]):
                client = socket.create_connection((lab.switch.ip, wire.DEFAULT_CONTROL_PORT), 2)
            client.sendall(b'{"op": "status"}\n')
            client.settimeout(1.0)
            with pytest.raises(TimeoutError):   # it waits in the backlog
                client.recv(1)
        finally:
            for s in socks:
                s.close()
        client.settimeout(5.0)
        reply = json.loads(client.makefile("rb").readline())
        client.close()
        assert reply["ok"] and reply["op"] == "status", reply

        def body(rank, w):
            a = np.arange(4096, dtype=np.int32) * (rank + 1)
            w.allreduce(a)
            return bool(np.array_equal(a, np.arange(4096, dtype=np.int32) * 3))

        t0 = time.monotonic()
        assert run_job(lab, "after-the-flood", ["udp", "udp"], body, timeout=30) == [True, True]
        assert time.monotonic() - t0 < 5
    log = "\n".join(sw.output)
    assert "Traceback" not in log, log[-3000:]
    assert f"control port: {cap} connections open (its limit); new ones wait" in log, log[-3000:]
    assert sw.proc.returncode == 0, log[-3000:]
