"""What the `swml` backend is called, and its options (init_process_group's
pg_options), each read from the environment when left None."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .. import wire
from ..client.engine_backend import lanes_from_env
from .staging import StagingConfig

BACKEND_NAME = "swml"


@dataclass
class SwmlOptions:
    """Options of the swml backend (pass as init_process_group's pg_options).
    Fields left None are read from the environment (process_group.py's module
    doc lists the variables)."""
    switch: str | None = None
    job: str | None = None
    backend: str | None = None          # the Worker's datapath: auto, udp, afxdp
    port: int | None = None             # the port each group tries first (docs/pytorch.md, "Subgroups")
    control_port: int = wire.DEFAULT_CONTROL_PORT
    iface: str | None = None            # the Worker's interface (default: route to the switch)
    gloo_iface: str | None = None       # Gloo's interface (default: see gloo_side.open_gloo)
    verbose: bool = False               # let the Worker say which datapath it took
    shm_bytes: int | None = None        # shared memory per rank of a host (SWML_SHM_BYTES; 4 MiB)
    staging: StagingConfig | None = None   # GPU tensors' chunks through host memory (staging.py)
    lanes: int | None = None            # the Worker's lanes (SWML_LANES; 1): docs/pytorch.md, "Subgroups"

    def resolved(self) -> SwmlOptions:
        env = os.environ
        switch = self.switch or env.get("SWML_SWITCH")
        if not switch:
            raise ValueError("the swml backend needs the switch's address: pass "
                             "pg_options=SwmlOptions(switch=...) or set SWML_SWITCH")
        port = self.port if self.port is not None else int(env.get("SWML_PORT", wire.DEFAULT_PORT))
        lanes = self.lanes if self.lanes is not None else lanes_from_env()
        return SwmlOptions(switch=switch, job=self.job or env.get("SWML_JOB"),
                           backend=self.backend or env.get("SWML_WORKER_BACKEND", "auto"),
                           port=port, control_port=self.control_port, iface=self.iface,
                           gloo_iface=self.gloo_iface,
                           verbose=self.verbose, shm_bytes=self.shm_bytes,
                           staging=self.staging or StagingConfig(), lanes=lanes)

    def for_subgroup(self, group_name: str) -> SwmlOptions:
        """A subgroup's options: a configured job name (SWML_JOB names the
        default group's job) gets the group's name appended, so that every
        group has a job of its own on the switch."""
        job = self.job or os.environ.get("SWML_JOB")
        return dataclasses.replace(self, job=f"{job}-{group_name}" if job else None)
