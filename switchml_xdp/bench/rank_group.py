"""The ranks of one `swml-lab bench` measurement: a process per worker
(bench/rank.py), each in its worker's network namespace, driven in lockstep
over JSON lines on their stdin and stdout."""
from __future__ import annotations

import contextlib
import json
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence


class RankError(RuntimeError):
    pass


class RankGroup:
    """One process per worker, in the worker's namespace, driven in lockstep."""

    def __init__(self, lab, argv_of: Callable[[int, object], list[str]], timeout: float = 300.0,
                 env: dict | None = None, hosts: Sequence | None = None):
        """hosts: the workers that run a rank, in rank order (default every
        worker of the lab: several groups on one lab are several jobs)."""
        self.lab = lab
        self.procs = []
        self.impl = None
        self.errs = []             # stderr of each rank: a file, so it can never block the rank
        for rank, host in enumerate(lab.workers if hosts is None else hosts):
            argv = [sys.executable, "-m", "switchml_xdp.bench.rank", *argv_of(rank, host)]
            err = tempfile.TemporaryFile("w+")
            self.errs.append(err)
            self.procs.append(lab.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=err, text=True, bufsize=1, env=env))
        try:
            replies = self._collect(timeout)
        except BaseException:
            self.close()
            raise
        self.impl = replies[0].get("impl")

    def _collect(self, timeout: float) -> list[dict]:
        """One JSON line from every rank; RankError with the first failure's reason."""
        deadline = time.monotonic() + timeout
        replies: dict[int, dict] = {}
        pending = {p.stdout.fileno(): (r, p) for r, p in enumerate(self.procs)}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankError(f"rank(s) {sorted(r for r, _ in pending.values())} did not answer "
                                f"within {timeout:g} s")
            ready, _, _ = select.select(list(pending), [], [], min(left, 1.0))
            for fd in ready:
                r, p = pending.pop(fd)
                line = p.stdout.readline()
                if not line:
                    p.wait(timeout=10)
                    self.errs[r].seek(0)
                    err = self.errs[r].read().strip().splitlines()
                    raise RankError(f"rank {r} exited ({p.returncode}): "
                                    f"{err[-1] if err else 'no output'}")
                msg = json.loads(line)
                if "error" in msg:
                    err = RankError(f"rank {r}: {msg['error']}")
                    err.state = {k: v for k, v in msg.items() if k != "error"}
                    raise err
                replies[r] = msg
        return [replies[r] for r in range(len(self.procs))]

    def run(self, iterations: int, warmup: int, timeout: float, late: dict | None = None) -> list[dict]:
        self.start(iterations, warmup, late=late)
        return self._collect(timeout)

    def start(self, iterations: int, warmup: int, start_at: float | None = None,
              late: dict | None = None) -> None:
        """Ask every rank to run, and return at once (collect() gets the
        answers): several groups started so run together. start_at: a
        time.monotonic() at which the first timed iteration begins; late:
        {"rank": R, "s": S}, rank R starts each timed call S seconds after
        the others (bench/late_peer.py)."""
        cmd = {"op": "run", "iterations": iterations, "warmup": warmup}
        if start_at is not None:
            cmd["start_at"] = start_at
        if late:
            cmd["late"] = late
        for p in self.procs:
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()

    def collect(self, timeout: float) -> list[dict]:
        """Every rank's answer to start(), in rank order."""
        return self._collect(timeout)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                if p.poll() is None:
                    p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    p.stdin.flush()
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            for f in (p.stdin, p.stdout):
                with contextlib.suppress(Exception):
                    f.close()
        for f in self.errs:
            f.close()

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
