"""A job that must stay exact while the security tests attack around it."""
from __future__ import annotations

import threading

import numpy as np

from control_helpers import PORT, wait_for


class HonestJob:
    """A world-2 job of real Workers that reduce int32 tensors until told to
    stop, checking every sum exactly; rank 0 starts first, so the job waits at
    its barrier until `start_rank1()` (or start both with `start()`)."""

    def __init__(self, lab, name: str, token: str, hosts, backend: str = "udp", port: int = PORT,
                 n: int = 4096):
        self.lab, self.name, self.token, self.hosts, self.N = lab, name, token, hosts, n
        self.backend, self.port = backend, port
        self.stop = threading.Event()
        self.calls = [0, 0]
        self.errors: list[str] = []
        self.workers = [None, None]
        self.threads = [threading.Thread(target=self._rank, args=(r,), daemon=True) for r in (0, 1)]
        self.threads[0].start()

    def start_rank1(self) -> None:
        self.threads[1].start()

    def wait_running(self, calls: int = 2) -> None:
        wait_for(lambda: min(self.calls) >= calls or self.errors, 30, "the honest job to reduce")
        assert not self.errors, self.errors

    def _rank(self, rank: int) -> None:
        from switchml_xdp import Worker

        try:
            with self.lab.enter(self.hosts[rank]), \
                    Worker(self.lab.switch.ip, self.name, rank, 2, backend=self.backend,
                           port=self.port, verbose=False, token=self.token) as w:
                self.workers[rank] = w
                base = np.arange(self.N, dtype=np.int32)
                want = base * 1 + base * 2
                while True:
                    a = base * (rank + 1)
                    w.allreduce(a)
                    if not np.array_equal(a, want):
                        self.errors.append(f"rank {rank}: wrong sum at call {self.calls[rank]}")
                        return
                    self.calls[rank] += 1
                    # Both ranks must make the same calls: agree on when to stop.
                    flag = np.array([self.stop.is_set()], np.int32)
                    if w.allreduce(flag, op="max")[0]:
                        break
        except Exception as e:  # noqa: BLE001 - reported by finish()
            self.errors.append(f"rank {rank}: {type(e).__name__}: {e}")

    def finish(self, min_calls: int = 5) -> None:
        """Both ranks go on reducing exactly for a few more calls, then stop."""
        before = list(self.calls)
        wait_for(lambda: min(self.calls) > min(before) + 3 or self.errors, 20,
                 "the honest job to keep reducing")
        self.stop.set()
        for t in self.threads:
            t.join(30)
        assert not self.errors, self.errors
        assert min(self.calls) >= min_calls, self.calls
