"""The operator's requests on the control port: `swml-switch job NAME
--weight W --dscp D` (docs/operations.md, "Shares between jobs").

Only the box's operator may make them: the request carries the daemon's
operator token, which it writes at start where only root reads it
(state_files.operator_path); a worker's job token does not do.
"""
from __future__ import annotations

import hmac
import logging

from .job_records import ControlError
from .state_files import operator_path

log = logging.getLogger("swml.control")


def job_share(table, operator_token: str | None, iface: str, msg: dict) -> dict:
    """Set a job's weight and/or mark; the reply. ControlError (one line,
    nothing changed) for a request without the right or with bad values."""
    if not operator_token or not hmac.compare_digest(msg["operator"].encode(),
                                                     operator_token.encode()):
        raise ControlError(f"not the operator's token: only root on the box (which reads "
                           f"{operator_path(iface)}) may change a job's share")
    job = table.set_share(msg["job"], msg["weight"], msg["dscp"])
    log.info("job %s: weight %g, dscp %s (the operator)", job.name, job.weight, job.dscp)
    return {"ok": True, "job": job.name, "weight": job.weight, "dscp": job.dscp}
