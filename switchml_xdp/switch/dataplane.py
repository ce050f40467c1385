"""The data plane behind the switch daemon: one interface, two implementations.

- `XdpDataplane` (xdp_dataplane.py): xdp/swml_switch.c loaded and attached to
  the interface, its maps pinned in bpffs. It outlives a crashed daemon, so a
  new daemon can adopt it with its running jobs.
- `UserspaceDataplane` (userspace.py): the same per-packet step in C, run by a
  thread of the daemon on a kernel UDP socket, its tables in process memory.
  It measures what XDP buys, and serves where XDP cannot be loaded.

The daemon (daemon.py) drives either the same way:

    dp.check_free(state)          # refuse an interface someone else holds
    dp.can_adopt(state)           # a dead daemon's data plane still serving here?
    maps = dp.open(ip, adopt)     # ready to take jobs; no packet handled yet
    ... JobTable(maps, ...), re-adopted jobs written ...
    dp.start(adopt)               # packets flow from here on
    ... serve the control protocol ...
    dp.close()                    # stop and release; what start() did is undone
"""
from __future__ import annotations

import abc
import os
from dataclasses import dataclass
from typing import ClassVar

from .. import wire
from .maps import DataplaneMaps


def netns_inode() -> int:
    """This process's network namespace (the state file records the daemon's,
    so that `down` can find the interface from another one)."""
    return os.stat("/proc/self/ns/net").st_ino


class DataplaneError(RuntimeError):
    """Why a data plane cannot be opened or started, in one line."""


#: How a completed RESULT reaches the members of its job (`swml-switch up
#: --fanout`): one frame to the job's multicast group, or a unicast copy to
#: each member, for networks without multicast (docs/design-decisions.md,
#: "Unicast fan-out").
FANOUTS = ("multicast", "unicast")
DEFAULT_FANOUT = "multicast"


@dataclass(frozen=True)
class SwitchParams:
    k: int = wire.DEFAULT_K
    slots: int = wire.DEFAULT_SLOTS
    port: int = wire.DEFAULT_PORT

    def validate(self) -> None:
        if not 1 <= self.k <= wire.MAX_K:
            raise DataplaneError(f"--elements must be in 1..{wire.MAX_K} (the most a frame of one "
                                 f"page carries, MTU {wire.MAX_MTU}), got {self.k}")
        if not 1 <= self.slots <= 65535:
            raise DataplaneError(f"--slots must be in 1..65535, got {self.slots}")
        if not 1 <= self.port <= 65535:
            raise DataplaneError(f"--port must be in 1..65535, got {self.port}")


class Dataplane(abc.ABC):
    """One data plane on one interface, for the daemon's whole life."""

    name: ClassVar[str]           # what --dataplane calls it, and the state file records
    needs_root: ClassVar[bool]    # whether `up` must run as root
    # Whether the data plane's own socket holds the switch's data address and
    # port; where not, the daemon holds them (data_port.py).
    holds_data_port: ClassVar[bool] = False

    def __init__(self, iface: str, params: SwitchParams):
        params.validate()
        self.iface, self.params = iface, params
        self.ports = [iface]   # the box's ports (switch/ports.py): one but for XDP's
        self.maps: DataplaneMaps | None = None

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """What serves, for people: the ready line and `status` ("native XDP")."""

    @property
    @abc.abstractmethod
    def mode(self) -> str | None:
        """The mode in use, once started: "native"/"generic" XDP, "user-space"."""

    @property
    def fanout(self) -> str:
        """How RESULTs reach the members (a name of FANOUTS), once opened."""
        return DEFAULT_FANOUT

    @abc.abstractmethod
    def check_free(self, state: dict | None) -> None:
        """Raise DataplaneError if something other than this switch (or a dead
        daemon's data plane it may take over, described by `state`, the
        interface's state file) holds the interface."""

    def can_adopt(self, state: dict) -> bool:
        """Whether the data plane of the dead daemon that wrote `state` still
        serves on the interface, with its tables, so that its jobs go on."""
        return False

    @abc.abstractmethod
    def open(self, ip: str, adopt: dict | None) -> DataplaneMaps:
        """Make the data plane ready to serve `ip` (with the tables of the dead
        daemon's data plane if `adopt` is its state); returns its maps. No
        packet is handled before start()."""

    @abc.abstractmethod
    def start(self, adopt: dict | None) -> None:
        """Handle packets from now on (taking over from the adopted data plane)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop handling packets and release everything. Safe after a failed
        open() or start(): an adopted data plane that was not taken over yet
        is left as it was."""

    def state(self) -> dict:
        """What the state file records about the data plane (other processes read it)."""
        return {"dataplane": self.name, "mode": self.mode, "label": self.label, "prog_id": 0,
                "fanout": self.fanout}

    def status_extra(self) -> dict:
        """Extra fields of the control protocol's `status` reply."""
        return {}

    @classmethod
    def left_behind(cls, iface: str) -> bool:
        """Whether a daemon that died without a state file left something on `iface`."""
        return False

    @classmethod
    def remove_leftovers(cls, iface: str, state: dict | None) -> tuple[list[str], list[str]]:
        """Undo what a dead daemon's data plane left on `iface` (for `down`);
        returns what was done and what could not be, in words."""
        return [], []
