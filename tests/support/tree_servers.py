"""Two control servers in one event loop, a parent box and a rack box below
it, on the loopback, over in-memory maps (no root, no data plane), and the
workers' raw control connections: the tree's control path of
switch/uplink.py, tested in tests/unit/test_tree_control.py."""
from __future__ import annotations

import asyncio
import json

from switchml_xdp.switch.control import ControlServer
from switchml_xdp.switch.jobs import JobTable
from switchml_xdp.switch.uplink import ParentLink, UplinkPort
from tree_maps import TreeMaps

HOST = "127.0.0.1"          # both boxes' control ports
UPLINK = UplinkPort("lo", "127.0.0.2", "02:00:00:00:00:02", 1)
PARENT_MAC = "02:00:00:00:00:01"
DATA_PORT = 48864           # every box's data port, and the workers' (one port a job)
LEASE_S = 30.0              # long: these tests send no heartbeats of their own


class Tree:
    """A parent box and one rack box, started by `start()`, ended by `stop()`."""

    async def start(self) -> Tree:
        self.parent_maps, self.rack_maps = TreeMaps(), TreeMaps()
        self.parent = ControlServer(JobTable(self.parent_maps, 8, 256, 16),
                                    {"ip": HOST, "port": DATA_PORT + 1}, LEASE_S)
        await self.parent.start(HOST, 0)
        self.parent_port = self.parent._listener.sock.getsockname()[1]
        self.link = ParentLink(UPLINK, HOST, self.parent_port, DATA_PORT,
                               resolve_mac=lambda ip, iface: PARENT_MAC)
        self.rack = ControlServer(JobTable(self.rack_maps, 8, 256, 16, below_parent=True),
                                  {"ip": HOST, "port": DATA_PORT}, LEASE_S, parent=self.link)
        await self.rack.start(HOST, 0)
        self.rack_port = self.rack._listener.sock.getsockname()[1]
        return self

    async def stop(self) -> None:
        for server in (self.rack, self.parent):
            await server.stop("the test is over")


class Client:
    """A worker's control connection, from its own loopback address."""

    @classmethod
    async def open(cls, port: int, src: str) -> Client:
        self = cls()
        self.src = src
        self.reader, self.writer = await asyncio.open_connection(HOST, port, local_addr=(src, 0))
        return self

    def send(self, obj: dict) -> None:
        self.writer.write((json.dumps(obj) + "\n").encode())

    async def recv(self, timeout: float = 5.0) -> dict | None:
        line = await asyncio.wait_for(self.reader.readline(), timeout)
        return json.loads(line) if line else None

    async def request(self, obj: dict, timeout: float = 5.0) -> dict:
        """The reply to `obj` (events that come first are skipped)."""
        self.send(obj)
        while True:
            got = await self.recv(timeout)
            if got is None or "event" not in got:
                return got

    def close(self) -> None:
        self.writer.close()


async def join(port: int, src: str, job: str, world: int, rank: int, token: str | None = "tok",
               timeout: float = 10.0, **fields) -> tuple[Client, dict]:
    """A worker's join, with more of the join's `fields` (lanes=2); (its
    connection, the reply)."""
    c = await Client.open(port, src)
    msg = {"op": "join", "job": job, "world": world, "rank": rank, "ip": src, "port": DATA_PORT,
           "timeout": timeout, **({"token": token} if token else {}), **fields}
    return c, await c.request(msg, timeout + 10)
