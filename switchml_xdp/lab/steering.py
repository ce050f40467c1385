"""Receive queues by UDP port on a lab whose links have several queues
(Lab(link_queues=Q)): xdp/lab/swml_steer.c on the ingress of every bridge
port, the lab's stand-in for the ntuple rules a NIC would need for a worker
streaming in lanes over AF_XDP (lane q's port on queue q). UDP to port p
comes in on queue p mod Q at the host it goes to; the rest keeps the flow
hash. Without it a veth's queue is its flow's hash, and a lane's RESULTs
land on whichever queue that picks.
"""
from __future__ import annotations

from collections.abc import Sequence

from .. import bpf
from .addressing import Host
from .errors import LabError

STEER_SOURCE = "lab/swml_steer.c"
STEER_PROG = "swml_steer"


def attach(bridge_ns: str, hosts: Sequence[Host], queues: int) -> bpf.Program:
    """Compile swml_steer.c for `queues` and put it on the bridge side of
    every host's link (in `bridge_ns`); the Program, for the lab to close
    (the filters go with the namespace). LabError on failure."""
    try:
        prog = bpf.compile_program(STEER_SOURCE, None, {"SWML_STEER_QUEUES": queues})
    except bpf.BpfError as e:
        raise LabError(f"cannot compile the lab's queue steering ({STEER_SOURCE}): {e}") from e
    try:
        fd = prog.load(STEER_PROG, "sched_cls")
        for host in hosts:
            bpf.tc_attach(host.peer, fd, STEER_PROG, netns=bridge_ns)
    except bpf.BpfError as e:
        prog.close()
        raise LabError(f"cannot steer the lab's queues by port: {e}") from e
    return prog
