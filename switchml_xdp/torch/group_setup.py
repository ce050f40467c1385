"""What the members of a `swml` process group agree on while it is made
(docs/pytorch.md, "Subgroups"): the group's UDP port, and whether every
member could set up its part, so that a group that cannot start fails the
same way on every member before any of them goes on.

The port. A job's members all use one UDP port (the switch sends each
member its RESULTs there), and a host that runs leaders of several groups
(one a group) needs a port for each. The hosts' leaders pick it together,
in rounds, through the group's store: first the configured port
(SwmlOptions.port, SWML_PORT, else 48864), then, each round, one leader in
turn lets its kernel pick a free port and the others try it. A leader holds
the port from its try to its Worker's start (client/port.py: hold), so
neither another group made at the same time (torch makes a subgroup only on
its members, so the groups of disjoint ranks are made concurrently) nor
another program takes it in between.

A Worker with several boxes or lanes uses a block of ports: box i's lane q
on port + i * lanes + q (client/boxes.py, box_port). The group agrees on
the whole block, every port of it free and held on every host, so that two
groups' blocks never overlap on a host. A block the kernel picks starts at a
multiple of the lanes, so lane q's ports are q mod lanes: the rule by which
the lab steers a lane's RESULTs to its receive queue, as a NIC's ntuple
rules must for afxdp's lanes (docs/performance.md, "Several queues per
worker").

The outcome. Each phase of the set-up ends with every rank saying "ok" or
its error under its own key; every rank reads them all (waiting at most the
group's timeout), and if one failed, all raise the same GroupSetupError,
naming the first rank that failed and why.
"""
from __future__ import annotations

import contextlib
import datetime
import socket

import torch.distributed as dist

from ..client.port import hold
from .hosts import HostLayout

PORT_ROUNDS = 8          # the configured port, then 7 picks by the kernels of the leaders in turn
# A kernel-picked port starts a block only where the ports after it are free
# too: so many picks a round before the leader gives up its turn.
BLOCK_PICKS = 16
MAX_PORT = 65535
_PORT_KEY = "swml/port/{round}/{host}"
_PHASE_KEY = "swml/setup/{phase}/{rank}"


class GroupSetupError(RuntimeError):
    """The process group could not start; every member raises the same one."""


def _wait(store: dist.Store, keys: list[str], timeout_s: float, what: str) -> None:
    try:
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
    except RuntimeError:        # DistStoreError: the wait timed out
        missing = [k for k in keys if not store.check([k])]
        raise GroupSetupError(f"{what}: no word from {', '.join(missing) or 'a rank'} within "
                              f"{timeout_s:g} s (a member exited, or is stuck before it)") from None


def _try_bind(port: int) -> socket.socket | None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return None
    return sock


def _close(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def _try_block(first: int, width: int) -> list[socket.socket] | None:
    """Sockets bound to ports first..first+width-1, or None (none kept) if
    one of them is taken or past the last port."""
    if first + width - 1 > MAX_PORT:
        return None
    socks: list[socket.socket] = []
    for port in range(first, first + width):
        sock = _try_bind(port)
        if sock is None:
            _close(socks)
            return None
        socks.append(sock)
    return socks


def _kernel_block(width: int, align: int = 1) -> list[socket.socket] | None:
    """A block of `width` free ports from the first multiple of `align` at
    or after a port the kernel picked."""
    for _ in range(BLOCK_PICKS):
        picked = _try_bind(0)
        if picked is None:
            return None
        port = picked.getsockname()[1]
        start = -(-port // align) * align
        if start == port:
            rest = _try_block(port + 1, width - 1)
            if rest is not None:
                return [picked, *rest]
            picked.close()
            continue
        picked.close()
        block = _try_block(start, width)
        if block is not None:
            return block
    return None


def agree_port(store: dist.Store, layout: HostLayout, preferred: int, timeout_s: float,
               width: int = 1, align: int = 1) -> int:
    """The first of the group's `width` consecutive UDP ports (module doc),
    all free on every host of the group and held (bound) by this host's
    leader until its Worker takes them; a kernel-picked one a multiple of
    `align` (the lanes). Only the hosts' leaders call this; GroupSetupError
    where no round finds a block."""
    host, tried = layout.host_index, []
    for rnd in range(PORT_ROUNDS):
        picker = (rnd - 1) % layout.n_hosts
        if rnd == 0 or host != picker:
            if rnd > 0:
                _wait(store, [_PORT_KEY.format(round=rnd, host=picker)], timeout_s, "the group's port")
                said = store.get(_PORT_KEY.format(round=rnd, host=picker)).decode()
                candidate = int(said[3:]) if said.startswith("ok:") else None
            else:
                candidate = preferred
            socks = _try_block(candidate, width) if candidate is not None else None
        else:
            socks = _kernel_block(width, align)    # the kernel picks one that is free here
            candidate = socks[0].getsockname()[1] if socks else None
        store.set(_PORT_KEY.format(round=rnd, host=host),
                  f"ok:{candidate}" if socks else f"no:{candidate}")
        keys = [_PORT_KEY.format(round=rnd, host=h) for h in range(layout.n_hosts)]
        _wait(store, keys, timeout_s, "the group's port")
        answers = [store.get(k).decode() for k in keys]
        if all(a.startswith("ok:") for a in answers):
            for sock in socks:
                hold(sock)
            return candidate
        _close(socks or [])
        tried.append(candidate if candidate is not None else "none")
    what = "UDP port" if width == 1 else f"block of {width} UDP ports"
    raise GroupSetupError(f"no {what} free on every host of the group: tried {tried}")


class SetupPhases:
    """The agreed outcome of each phase of a group's set-up (module doc)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout_s: float, label: str):
        self.store, self.rank, self.size = store, rank, size
        self.timeout_s, self.label = timeout_s, label

    @contextlib.contextmanager
    def phase(self, name: str):
        """Run the body; then every rank learns whether every rank's body
        succeeded. Raises the same GroupSetupError on every rank if one failed."""
        key = _PHASE_KEY.format(phase=name, rank=self.rank)
        try:
            yield
        except Exception as e:      # told to every member, then raised alike
            self.store.set(key, f"!{type(e).__name__}: {e}")
            self._agree(name, e)
            raise AssertionError("unreachable: _agree raises after a failure") from e
        except BaseException as e:  # an interrupt: the others learn it, this rank stops now
            self.store.set(key, f"!{type(e).__name__} on this rank")
            raise
        self.store.set(key, "ok")
        self._agree(name, None)

    def _agree(self, name: str, own: BaseException | None) -> None:
        keys = [_PHASE_KEY.format(phase=name, rank=r) for r in range(self.size)]
        _wait(self.store, keys, self.timeout_s, f"{self.label} could not start")
        for r, key in enumerate(keys):
            said = self.store.get(key).decode()
            if said.startswith("!"):
                raise GroupSetupError(f"{self.label} could not start: rank {r}: {said[1:]}") from own
