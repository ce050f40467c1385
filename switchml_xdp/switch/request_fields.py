"""Every field a client may send on the control port, and the one check of it.

control.py calls `validate` once for every request, before any handler runs:
what comes out holds only the fields of the request's op, each of the right
JSON type (an integer is a JSON integer: not `4.0`, not `true`), within its
bounds and character set, and encodable as UTF-8 (no unpaired surrogate can
reach a hash, a log, the state file or a terminal). A MAC comes out in lower
case. The job table (jobs.py) trusts these values and checks only what
depends on its state: tokens against the job's, ranks against a running
job's world, the worker's k against the switch's.

A refusal is a FieldError whose message is one line, naming the field and
showing at most a short, escaped piece of the value (docs/protocol.md,
"Errors").
"""
from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from .. import wire

DEFAULT_JOIN_TIMEOUT_S = 60.0
MAX_JOIN_TIMEOUT_S = 600.0       # the longest a join may wait at its barrier
# Job names reach logs and terminals (`status`): letters, digits, . _ - only.
JOB_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_JOB_NAME_LEN = 64
MAX_TOKEN_LEN = 256
MAC_RE = re.compile(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}")
SHOWN_CHARS = 40                 # of a refused value, in the error line


class FieldError(Exception):
    """A request field the switch refuses; the message goes back to the client."""


def shown(v: object) -> str:
    """A refused value for an error line: ASCII only (control characters and
    surrogates escaped), cut to SHOWN_CHARS."""
    text = ascii(v) if not isinstance(v, int) or abs(v) < 10**SHOWN_CHARS else "a huge integer"
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


Bound = int | Callable[[dict], int]   # a bound may depend on the fields checked before


@dataclass(frozen=True)
class Integer:
    lo: Bound
    hi: Bound

    def check(self, key: str, v: object, fields: dict) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise FieldError(f"'{key}' must be an integer, got {type(v).__name__}")
        lo, hi = (b(fields) if callable(b) else b for b in (self.lo, self.hi))
        if not lo <= v <= hi:
            raise FieldError(f"'{key}' must be in {lo}..{hi}, got {shown(v)}")
        return v


@dataclass(frozen=True)
class Seconds:
    """A number of seconds in (0, most]: a JSON integer or float, not a boolean."""
    most: float

    def check(self, key: str, v: object, fields: dict) -> float:
        is_number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not is_number or not (math.isfinite(v) and 0 < v <= self.most):
            raise FieldError(f"'{key}' must be a number of seconds in (0, {self.most:g}]")
        return v


@dataclass(frozen=True)
class Text:
    """A non-empty string of printable characters (which excludes control
    characters and unpaired surrogates), at most `longest` of them, matching
    `pattern` where one is given (`charset` says what it allows)."""
    longest: int
    pattern: re.Pattern | None = None
    charset: str = ""

    def check(self, key: str, v: object, fields: dict) -> str:
        if not isinstance(v, str) or not v or len(v) > self.longest:
            raise FieldError(f"'{key}' must be a non-empty string of at most {self.longest} characters")
        if self.pattern is not None and not self.pattern.fullmatch(v):
            raise FieldError(f"'{key}' may contain only {self.charset}")
        if not v.isprintable():
            raise FieldError(f"'{key}' must be printable text: no control characters, no unpaired "
                             f"surrogates")
        return v


@dataclass(frozen=True)
class Ipv4:
    def check(self, key: str, v: object, fields: dict) -> str:
        Text(15).check(key, v, fields)
        try:
            ipaddress.IPv4Address(v)
        except ValueError:
            raise FieldError(f"'{key}' is not an IPv4 address: {shown(v)}") from None
        return v


@dataclass(frozen=True)
class Mac:
    """A MAC aa:bb:cc:dd:ee:ff (returned in lower case), or "" for none."""

    def check(self, key: str, v: object, fields: dict) -> str:
        if not isinstance(v, str):
            raise FieldError(f"'{key}' must be a string")
        if v and not MAC_RE.fullmatch(v):
            raise FieldError(f"'{key}' must be a MAC address like 02:5d:00:00:01:00 (or empty), "
                             f"got {shown(v)}")
        return v.lower()


@dataclass(frozen=True)
class Weight:
    """A job's weight: a finite JSON number above zero (not a boolean); the
    cap is the table's (jobs.py)."""

    def check(self, key: str, v: object, fields: dict) -> float:
        is_number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not is_number or not (math.isfinite(v) and v > 0):
            raise FieldError(f"'{key}' must be a number above zero, got {shown(v)}")
        return float(v)


@dataclass(frozen=True)
class Flag:
    """A JSON true or false (not 0 or 1)."""

    def check(self, key: str, v: object, fields: dict) -> bool:
        if not isinstance(v, bool):
            raise FieldError(f"'{key}' must be true or false, got {shown(v)}")
        return v


@dataclass(frozen=True)
class Nullable:
    """`field`, or null (what an absent field also gives)."""
    field: Integer | Text | Weight

    def check(self, key: str, v: object, fields: dict):
        return None if v is None else self.field.check(key, v, fields)


REQUIRED = object()   # a field without a default


@dataclass(frozen=True)
class Field:
    kind: Integer | Seconds | Text | Ipv4 | Mac | Flag | Weight | Nullable
    default: object = REQUIRED


MAX_BOXES_LEN = 1024   # a comma-separated list of box addresses
TOKEN = Field(Nullable(Text(MAX_TOKEN_LEN)), None)
JOB = Field(Text(MAX_JOB_NAME_LEN, JOB_NAME_RE, "letters, digits, '.', '_' and '-'"))

#: op -> its fields, checked in this order (a bound may use an earlier field).
SCHEMAS: dict[str, dict[str, Field]] = {
    "join": {
        "timeout": Field(Seconds(MAX_JOIN_TIMEOUT_S), DEFAULT_JOIN_TIMEOUT_S),
        "job": JOB,
        "token": TOKEN,
        "world": Field(Integer(1, wire.MAX_WORLD)),
        "rank": Field(Integer(0, lambda f: f["world"] - 1)),
        "port": Field(Integer(1, 65535)),
        "ip": Field(Ipv4()),
        "mac": Field(Mac(), ""),
        "k": Field(Nullable(Integer(1, wire.MAX_K)), None),
        # Lanes, a power of two (docs/performance.md, "Several queues per
        # worker"): the rank sends and receives on port..port+lanes-1.
        "lanes": Field(Integer(1, wire.MAX_LANES), 1),
        # A job over several boxes: every box its rank joins, as the rank
        # lists them (the same on every rank, or the join is refused).
        "boxes": Field(Nullable(Text(MAX_BOXES_LEN)), None),
        # A rank behind the rack box at ip:port, which joins for it (a tree
        # of boxes: docs/protocol.md, "Rack boxes").
        "rack": Field(Flag(), False),
        # Its weight under `up --share weighted`, capped at --max-weight.
        "weight": Field(Nullable(Weight()), None),
    },
    "resume": {"job": JOB, "token": TOKEN, "job_id": Field(Integer(1, wire.MAX_JOBS - 1)),
               "rank": Field(Integer(0, wire.MAX_WORLD - 1))},
    "heartbeat": {"token": TOKEN},
    "leave": {"token": TOKEN},
    "status": {},
    # The operator's `swml-switch job NAME --weight W --dscp D`: `operator`
    # is the daemon's operator token (only root can read it on the box).
    "job": {"operator": Field(Text(MAX_TOKEN_LEN)), "job": JOB,
            "weight": Field(Nullable(Weight()), None),
            "dscp": Field(Nullable(Integer(0, 63)), None)},
}


def validate(op: str, msg: dict) -> dict:
    """The request's fields, checked (FieldError if one is not as its op's
    schema says, or is not one of them), defaults filled in; `op` included."""
    schema = SCHEMAS[op]
    unknown = [k for k in msg if k != "op" and k not in schema]
    if unknown:
        names = ", ".join(schema) or "none"
        raise FieldError(f"unknown field {shown(unknown[0])} in {op}; its fields are {names}")
    out: dict = {"op": op}
    for key, field in schema.items():
        if key not in msg:
            if field.default is REQUIRED:
                raise FieldError(f"'{key}' is required")
            out[key] = field.default
            continue
        out[key] = field.kind.check(key, msg[key], out)
    return out
