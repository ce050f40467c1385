"""In-memory maps that remember what a tree's control plane wrote: job
entries (rank masks, uplinks), member rows and parent routes (the unit
tests of switch/jobs.py's tree and switch/uplink.py)."""
from __future__ import annotations

from switchml_xdp.switch.maps import JobEntry
from switchml_xdp.switch.userspace import MemoryMaps


class TreeMaps(MemoryMaps):
    def __init__(self, k: int = 8, slots: int = 256):
        super().__init__(k=k, slots=slots)
        self.entries: dict[int, JobEntry] = {}
        self.member_rows: dict[int, dict[int, tuple[str, int]]] = {}
        self.routes: dict[tuple[str, int], int] = {}

    def write_job(self, job_id: int, e: JobEntry) -> None:
        super().write_job(job_id, e)
        self.entries[job_id] = e

    def clear_job(self, job_id: int, world: int) -> None:
        super().clear_job(job_id, world)
        self.entries.pop(job_id, None)
        rows = self.member_rows.get(job_id, {})
        for rank in range(world):
            rows.pop(rank, None)

    def write_member(self, job_id: int, rank: int, ip: str, port: int) -> None:
        super().write_member(job_id, rank, ip, port)
        self.member_rows.setdefault(job_id, {})[rank] = (ip, port)

    def write_parent_route(self, parent_ip: str, parent_job: int, job_id: int) -> None:
        self.routes[(parent_ip, parent_job)] = job_id

    def clear_parent_route(self, parent_ip: str, parent_job: int) -> None:
        self.routes.pop((parent_ip, parent_job), None)
