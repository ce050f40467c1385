"""Deprecated: the old attach module, kept until its callers use switchml_xdp.bpf."""
from __future__ import annotations

from ..net import link_index as ifindex  # noqa: F401
from .errors import XdpError  # noqa: F401
from .xdp import Attachment, attachment, detach  # noqa: F401
from .xdp import attach as _attach


def attach(iface: str, prog_fd: int, mode: str, replace: bool = False) -> None:
    _attach(iface, prog_fd, mode, replace=replace)
