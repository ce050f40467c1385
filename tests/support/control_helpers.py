"""A raw client of the control protocol and the waits the control-plane tests
share (tests/test_control*.py, test_security_control.py, test_daemon.py)."""
from __future__ import annotations

import itertools
import json
import socket
import time

from switchml_xdp import wire

PORT = 48950          # the workers' UDP port in join requests (no data is sent)
LEASE_S = 2.0         # conftest.py starts the shared switch with --lease 2
JOB_SLOTS = 128       # the daemon's default window a job
MAX_LINE = 64 * 1024
_names = itertools.count()


def job_name(tag: str) -> str:
    return f"ctl-{tag}-{next(_names)}"


class Raw:
    """A hand-driven control connection from a worker's namespace. Reads are
    line-exact (no file object: those cannot be read after a timeout)."""

    def __init__(self, lab, host=None, port: int = wire.DEFAULT_CONTROL_PORT,
                 box_ip: str | None = None):
        """box_ip: the box to connect to (default: the lab's switch)."""
        self.host = host or lab.workers[0]
        with lab.enter(self.host):
            self.sock = socket.create_connection((box_ip or lab.switch.ip, port), timeout=5)
        self.buf = b""

    def send(self, obj) -> None:
        data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
        self.sock.sendall(data + b"\n")

    def recv(self, timeout: float = 5.0) -> dict | None:
        """The next line as an object, None at EOF; TimeoutError if none came."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line within {timeout:g} s")
            self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                assert not self.buf, f"connection closed after a partial line {self.buf[:200]!r}"
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def silent(self, timeout: float) -> bool:
        """True if nothing arrives for `timeout` seconds."""
        try:
            got = self.recv(timeout)
        except TimeoutError:
            return True
        raise AssertionError(f"expected silence, got {got!r}")

    def request(self, obj, timeout: float = 5.0) -> dict:
        self.send(obj)
        reply = self.recv(timeout)
        assert reply is not None, f"connection closed instead of a reply to {obj!r}"
        return reply

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def join_msg(job: str, world: int, rank: int, host, port: int = PORT, **kw) -> dict:
    return {"op": "join", "job": job, "world": world, "rank": rank, "ip": host.ip,
            "port": port, "mac": host.mac, **kw}


def status(lab) -> dict:
    with Raw(lab, lab.workers[-1]) as r:
        reply = r.request({"op": "status"})
    assert reply["ok"] and reply["op"] == "status", reply
    return reply


def job_of(st: dict, name: str) -> dict | None:
    return next((j for j in st["jobs"] if j["name"] == name), None)


def wait_for(pred, timeout: float = 5.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.01)


def wait_members(lab, name: str, ranks: set[int]) -> dict:
    """Wait until the job's registered ranks are exactly `ranks`."""
    def check():
        j = job_of(status(lab), name)
        return j if j is not None and set(map(int, j["members"])) == ranks else None
    return wait_for(check, what=f"job {name} to have ranks {sorted(ranks)}")


def wait_gone(lab, name: str, slots_free: int) -> None:
    wait_for(lambda: (st := status(lab)) and job_of(st, name) is None and st["slots_free"] == slots_free,
             what=f"job {name} to end and {slots_free} slots to be free")


def assert_error(reply: dict, *words: str, op: str | None = None) -> str:
    assert reply is not None, "no reply"
    assert reply["ok"] is False and isinstance(reply["error"], str), reply
    assert "\n" not in reply["error"]
    assert reply.get("op") == op, reply
    for w in words:
        assert w in reply["error"], f"{w!r} not in {reply['error']!r}"
    return reply["error"]
