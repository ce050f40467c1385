"""Run the real switch daemon and real workers inside a Lab.

Shared by the tests, `swml-lab demo` and the benchmarks: the switch is
`swml-switch up` in the switch namespace (or in box b's, for a lab of
several boxes); workers run either as threads of
this process (each thread moved into its worker's namespace) or as
processes.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait

from . import lifecycle, netns
from .addressing import Host
from .errors import LabError
from .namespace_lab import Lab

READY_MARK = " up on "   # in the switch daemon's ready line


class SwitchProcess:
    """`swml-switch up` running in the namespace of one of the lab's boxes
    (the switch's unless told)."""

    def __init__(self, lab: Lab, args: Sequence[str] = (), ready_timeout: float = 60.0,
                 env: dict[str, str] | None = None, box: int = 0):
        """env: extra environment variables for the daemon, on top of ours;
        box: which of lab.switches it runs on."""
        self.lab = lab
        self.host = _box(lab, box)
        self.iface = self.host.iface
        ports = [p.iface for p in lab.box_ports] if box == 0 else []   # Lab(ports=P)
        argv = switch_argv(self.iface, [*ports, *args])
        self.started = time.monotonic()
        self.proc = lab.popen(self.host, argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1,
                              env={**os.environ, **env} if env else None)
        self.output: list[str] = []
        self.ready_line = self._wait_ready(ready_timeout)
        self.startup_s = time.monotonic() - self.started
        # Keep draining its output so the daemon never blocks on a full pipe.
        self._drain = threading.Thread(target=self._drain_output, daemon=True)
        self._drain.start()

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line.rstrip())
            if READY_MARK in line:
                return line.strip()
        self.stop()
        raise RuntimeError("swml-switch did not come up:\n" + "\n".join(self.output[-30:]))

    def _drain_output(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._remove_leftovers()
        return self.proc.returncode

    def _remove_leftovers(self) -> None:
        """A daemon that was killed leaves its pins and state file (on purpose:
        a restarted daemon re-adopts them). Once the lab is done with it, they go."""
        from .. import bpf
        from ..switch import state_files

        if state_files.remove_leftover_files(self.iface):   # no daemon of this interface is alive
            bpf.remove_pins(bpf.pin_dir(self.iface))

    def __enter__(self) -> SwitchProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def switch_argv(iface: str, args: Sequence[str] = ()) -> list[str]:
    """`swml-switch up IFACE ARGS` with this interpreter (the venv's, also under sudo)."""
    return [sys.executable, "-m", "switchml_xdp.cli.switch", "up", iface, *args]


def _box(lab: Lab, box: int) -> Host:
    if isinstance(box, bool) or not isinstance(box, int) or not 0 <= box < len(lab.switches):
        raise LabError(f"lab {lab.prefix} has boxes 0..{len(lab.switches) - 1}, not {box!r}")
    return lab.switches[box]


def daemon_key(box: int) -> str:
    """Where the lab's state file records the background switch of box `box`."""
    return f"switch_daemon{box or ''}"


def start_background_switch(lab: Lab, args: Sequence[str] = (), ready_timeout: float = 60.0,
                            box: int = 0) -> str:
    """`swml-switch up` in the namespace of box `box` (the switch's unless
    told), detached from this process (its own session, output to a log
    file) so it outlives `swml-lab up`; it goes when the lab does (`swml-lab
    down` stops every process in the lab's namespaces, and SIGTERM detaches
    the switch cleanly). Returns its ready line; LabError with the end of its
    log if it does not come up."""
    host = _box(lab, box)
    log_path = lifecycle.switch_log_path(lab.prefix, box)
    with open(log_path, "w") as log:
        proc = netns.popen_in(host.ns, switch_argv(host.iface, args),
                              stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    state = lifecycle.read_state(lab.prefix) or lab.describe()
    state[daemon_key(box)] = {"pid": proc.pid, "log": str(log_path), "args": list(args)}
    lifecycle.write_state(lab.prefix, state)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        text = log_path.read_text()
        ready = [line for line in text.splitlines() if READY_MARK in line]
        if ready:
            return ready[0].strip()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = "\n".join(log_path.read_text().splitlines()[-10:])
    if proc.poll() is None:
        netns.terminate_pids([proc.pid])
    raise LabError(f"the switch did not come up in lab {lab.prefix}"
                   + (f" (box {host.name})" if box else "")
                   + (f":\n{tail}" if tail else " (no output)"))


def run_ranks(lab: Lab, hosts: Sequence[Host], fn: Callable[[int, Host], object],
              timeout: float = 120.0, beside: Callable[[], object] | None = None) -> list:
    """Call fn(rank, host) for every rank at once, each in a thread that lives
    in its host's network namespace; return the results in rank order and
    re-raise the first failure. beside: what disturbs the lab meanwhile (stops
    a box, kills a daemon), on a thread of its own in the caller's namespace,
    waited for after the ranks however they ended; its own failure is raised
    if the ranks' was not."""
    def body(rank: int, host: Host):
        with lab.enter(host):
            return fn(rank, host)

    with ThreadPoolExecutor(max_workers=len(hosts) + 1) as pool:
        side = pool.submit(beside) if beside is not None else None
        try:
            futures = [pool.submit(body, r, h) for r, h in enumerate(hosts)]
            results = [f.result(timeout=timeout) for f in futures]
        except BaseException:
            if side is not None:
                wait([side])
            raise
        if side is not None:
            side.result()
        return results


class RanksFailed(RuntimeError):
    """Rank processes exited non-zero or ran past their deadline."""


def run_rank_processes(lab: Lab, placements: Sequence[tuple], timeout: float,
              env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """run_ranks with processes: one per (host, argv) or (host, argv,
    rank_env), all at once, each in its host's namespace with Gloo bound to
    the host's lab interface, `env` and its own rank_env on top of ours;
    returns their (stdout, stderr) in order. RanksFailed with every failing rank's stderr tail if one exits
    non-zero, or with every rank's if they are not all done within
    `timeout` seconds (then all are killed)."""
    procs = []
    for host, argv, *rank_env in placements:
        # Gloo binds to the lab interface, not to whatever the hostname resolves to.
        penv = {**os.environ, **(env or {}), **(rank_env[0] if rank_env else {}),
                "GLOO_SOCKET_IFNAME": host.iface, "OMP_NUM_THREADS": "1"}
        procs.append(lab.popen(host, list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=penv))
    outs, errors = [], []
    deadline = time.monotonic() + timeout
    for rank, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            said = [f"rank {i}: {q.communicate()[1].strip()[-1500:]}" for i, q in enumerate(procs)]
            raise RanksFailed(f"ranks did not finish within {timeout:g} s\n" + "\n".join(said)) from None
        outs.append((stdout, stderr))
        if p.returncode != 0:
            errors.append(f"rank {rank} exited {p.returncode}:\n{stderr.strip()[-2000:]}")
    if errors:
        raise RanksFailed("\n".join(errors))
    return outs


def rank_result(stdout: str) -> dict | None:
    """The last `RESULT {json}` line a rank printed, or None."""
    import json

    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None
