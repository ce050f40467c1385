"""The path's ceiling: a raw AF_XDP ping-pong of swml-sized frames through
the trivial reflector on the box's port (reflector.py, xdp/swml_reflect.c),
what xdpsock's l2fwd measures, so that swml's packets a second can be read as
a fraction of what the path does at all (docs/performance.md, "The path's
ceiling").

The worker's end is swml's: the same port (worker/port.h: the AF_XDP socket
and UMEM code, and in copy mode the sends on the port's UDP socket with GSO,
as the afxdp backend's), the same redirect program (xdp/swml_redirect.c, with the
reflector in the switch's place), frames of DATA's size at k (74 + 4k bytes),
the engine's rx batch, and `window` frames in flight as swml keeps its slots
full; no quantization, no aggregation (worker/raw_path.c).

    r = measure("10.0.0.1", k=256, window=128, seconds=1.0)
    r["pps"], r["gbps"], fraction(swml_row["packets_per_s"], r["pps"])

`python -m switchml_xdp.bench.raw_path --switch IP ...` prints one JSON object:
what `swml-lab bench` runs in each worker's namespace.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Callable

import numpy as np

from .. import bpf, mtu, net, wire

DEFAULT_WINDOW = 128     # the daemon's default job slots: what swml keeps in flight
DEFAULT_SECONDS = 1.0
DEFAULT_WARMUP = 0.2
MAC_WAIT_S = 1.0         # for the box's MAC to be resolved
PROBE_S = 0.05           # a try for an echo while waiting for the reflector


class NoEcho(RuntimeError):
    """Nothing came back: no reflector at the address (yet)."""


def fraction(swml_pps: float | None, raw_pps: float | None) -> float | None:
    """swml's packets a second as a fraction of the raw path's (None when
    either is missing or the raw path moved nothing)."""
    if not swml_pps or not raw_pps:
        return None
    return swml_pps / raw_pps


def swml_pps(elements: int, k: int, slots: int, tat_s: float, dtype: str = "float32",
             op: str = "sum") -> float:
    """swml's packets a second a worker: the DATA packets one call streams
    (plans.packets_needed; each answered by a RESULT) over the call's time."""
    from ..client.plans import packets_needed

    return packets_needed(elements, np.dtype(dtype), k, slots, wire.OPS[op]) / tat_s


def _box_mac(sock: socket.socket, switch_ip: str, iface: str) -> str:
    """The box's MAC, resolved by a datagram to its discard port if need be."""
    deadline = time.monotonic() + MAC_WAIT_S
    sock.sendto(b"", (switch_ip, 9))
    while True:
        try:
            return net.next_hop_mac(switch_ip, iface)
        except net.NetError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def measure(switch_ip: str, k: int = 256, window: int = DEFAULT_WINDOW,
            seconds: float = DEFAULT_SECONDS, warmup: float = DEFAULT_WARMUP, *,
            port: int = wire.DEFAULT_PORT, reflect_port: int = wire.DEFAULT_PORT,
            iface: str | None = None, mode: str | None = None, batch: int = 0,
            spin: int | None = None, before: Callable[[], None] | None = None) -> dict:
    """Frames of k int32 elements from this host's `port` to the reflector at
    switch_ip:reflect_port and back, `window` in flight, counted for `seconds`
    after `warmup`; `before` is called once everything is set up, just before
    the first frame (several workers wait there to start together). Returns
    the engine's counts plus pps (echoes a second), gbps (their frames' bits a
    second, one way), rtt_us (window / pps), and when it began and ended
    (time.monotonic(): one clock for every namespace of the host).
    RuntimeError with a one-line reason if it cannot run or nothing came back."""
    from ..client.afxdp_backend import (
        PORT_RCVBUF,
        SPIN,
        compile_redirect,
        copy_mode_sends,
        set_peer,
        unavailable_reason,
    )
    from ..client.port import reserve_port

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"the raw path needs the afxdp backend: {reason}")
    local_ip, route_iface = net.route_to(switch_ip, reflect_port)
    iface = iface or route_iface
    if iface != route_iface:
        local_ip = net.link_ipv4(iface)
    mac = net.link_mac(iface)
    if bpf.attachment(iface).mode is not None:
        raise RuntimeError(f"{iface} already has an XDP program (an afxdp worker?): the raw "
                           "path needs the interface to itself")
    from .. import _engine

    sock = reserve_port(port, None, local_ip, PORT_RCVBUF)
    try:
        mtu.check_iface(k, iface)          # a frame the link drops would look like no reflector
        box_mac = _box_mac(sock, switch_ip, iface)
        with compile_redirect(port, local_ip) as prog:
            set_peer(prog, switch_ip, reflect_port, group_ip=local_ip)
            with bpf.attach_link(iface, prog.fd, mode, quiet=True):
                abort = np.zeros(1, dtype=np.uint32)
                if before:
                    before()
                began = time.monotonic()
                r = _engine.raw_pingpong(
                    iface, prog.map_fd("xsks"), abort, wire.mac_to_bytes(mac),
                    wire.mac_to_bytes(box_mac), socket.inet_aton(local_ip),
                    socket.inet_aton(switch_ip), port, reflect_port, k, window,
                    batch, SPIN if spin is None else spin, warmup, seconds,
                    sock.fileno() if copy_mode_sends(sock, switch_ip, reflect_port, local_ip,
                                                     iface) else -1)
        ended = time.monotonic()
    except (bpf.XdpError, net.NetError, OSError, ValueError) as e:
        raise RuntimeError(f"raw path to {switch_ip}:{reflect_port}: {e}") from None
    finally:
        sock.close()
    if not r["echoed"]:
        raise NoEcho(f"no frame came back from {switch_ip}:{reflect_port}: is the "
                           "reflector up on the box (`swml-switch reflect IFACE`)?")
    elapsed = r["elapsed_ns"] / 1e9
    pps = r["echoed"] / elapsed
    return {**r, "k": k, "window": window, "iface": iface, "seconds": elapsed,
            "began": began, "ended": ended,
            "pps": pps, "gbps": pps * r["frame_len"] * 8 / 1e9, "rtt_us": window / pps * 1e6}


def measure_when_up(switch_ip: str, k: int, window: int, wait_s: float,
                    say: Callable[[str], None], **kw) -> dict:
    """measure(), once the reflector answers: tried every half second for up
    to wait_s (a box turns from the switch into the reflector in between)."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            measure(switch_ip, k, window, PROBE_S, 0.0, **kw)
            break
        except NoEcho:
            if time.monotonic() > deadline:
                raise
            if not said:
                say(f"waiting up to {wait_s:g} s for the reflector at {switch_ip} (on the box: "
                    "`swml-switch down IFACE; swml-switch reflect IFACE`) ...")
                said = True
            time.sleep(0.5)
    return measure(switch_ip, k, window, **kw)


def beside(rows: list[dict], raw: dict) -> str:
    """The raw path's figures, and each row's packets a second as a fraction
    of its (rows of allreduce_bench.run, which gain "raw_pps_fraction")."""
    lines = [f"raw path: {raw['pps'] / 1e3:.1f} kpps, {raw['gbps']:.3f} Gbit/s of "
             f"{raw['frame_len']}-byte frames (k={raw['k']}, {raw['window']} in flight, "
             f"RTT {raw['rtt_us']:.0f} us; {raw['lost']} lost, {raw['bad']} bad)"]
    for r in rows:
        pps = swml_pps(r["elements"], r["k"], r["slots"], r["tat_median_s"], r["dtype"], r["op"])
        r["raw_pps_fraction"] = f = fraction(pps, raw["pps"])
        pct = "-" if f is None else f"{100 * f:.1f}%"
        lines.append(f"rank {r['rank']} swml {r['bytes'] / 2**20:g} MiB: {pps / 1e3:.1f} kpps "
                     f"(packets a call / median TAT) = {pct} of the raw path's packets a second")
    return "\n".join(lines)


def _ready_go() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m switchml_xdp.bench.raw_path",
                                description="the raw path's ping-pong; one JSON object")
    p.add_argument("--switch", required=True, help="the reflector's (the box's) IPv4 address")
    p.add_argument("--k", type=int, default=256, help="int32 elements a frame (74 + 4k bytes)")
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW, help="frames in flight")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS)
    p.add_argument("--warmup", type=float, default=DEFAULT_WARMUP)
    p.add_argument("--port", type=int, default=wire.DEFAULT_PORT, help="this host's UDP port")
    p.add_argument("--reflect-port", type=int, default=wire.DEFAULT_PORT)
    p.add_argument("--ready-go", action="store_true",
                   help="once set up, print 'ready' and begin at a line on stdin (several "
                        "workers together)")
    a = p.parse_args(argv)
    try:
        r = measure(a.switch, a.k, a.window, a.seconds, a.warmup, port=a.port,
                    reflect_port=a.reflect_port, before=_ready_go if a.ready_go else None)
    except RuntimeError as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
