"""The control port's door (switchml_xdp/switch/request_fields.py): every
field of every op refused when it has the wrong type, a float for an
integer, a boolean, too many characters, a character outside its set, an
unpaired surrogate, or a huge size; each refusal one printable ASCII line.
The same door in the real daemon: tests/lab/test_control.py."""
from __future__ import annotations

import json

import pytest

from switchml_xdp import wire
from switchml_xdp.switch.request_fields import SCHEMAS, FieldError, validate

GOOD = {
    "join": {"op": "join", "job": "j1", "token": "s3cret", "world": 4, "rank": 1, "port": 48864,
             "ip": "10.0.0.11", "mac": "02:5d:00:00:01:00", "k": 256, "lanes": 4, "timeout": 5,
             "boxes": "10.0.0.1,10.0.0.2", "rack": True, "weight": 2.5},
    "resume": {"op": "resume", "job": "j1", "token": "s3cret", "job_id": 3, "rank": 1},
    "heartbeat": {"op": "heartbeat", "token": "s3cret"},
    "leave": {"op": "leave", "token": "s3cret"},
    "status": {"op": "status"},
    "job": {"op": "job", "operator": "ab" * 16, "job": "j1", "weight": 3.0, "dscp": 46},
}

HUGE = "x" * 65536
SURROGATE = "\ud800"
ESCAPES = "\x1b]0;owned\x07\x1b[2J"

# field -> values it must refuse, with words of the refusal
BAD = {
    "job": [(7, "non-empty string"), (True, "non-empty string"), (1.5, "non-empty string"),
            ("", "non-empty string"), ("j" * 65, "at most 64"), ("a b", "may contain only"),
            (ESCAPES, "may contain only"), (SURROGATE, "may contain only"),
            (HUGE, "at most 64"), (None, "non-empty string")],
    "token": [(5, "non-empty string"), (True, "non-empty string"), (2.0, "non-empty string"),
              ("", "non-empty string"), ("t" * 257, "at most 256"), (SURROGATE, "printable"),
              ("ab" + SURROGATE, "printable"), (ESCAPES, "printable"), ("a\nb", "printable"),
              (HUGE, "at most 256"), (["t"], "non-empty string")],
    "world": [("4", "integer, got str"), (4.0, "integer, got float"), (True, "integer, got bool"),
              (0, "in 1..64, got 0"), (65, "in 1..64, got 65"), (10**400, "a huge integer"),
              (None, "integer, got NoneType")],
    "rank": [("1", "integer, got str"), (1.0, "integer, got float"), (False, "integer, got bool"),
             (-1, "got -1"), (4, "in 0..3, got 4"), (10**30, "got 1000000")],
    "port": [("1", "integer, got str"), (80.0, "integer, got float"), (True, "integer, got bool"),
             (0, "in 1..65535, got 0"), (65536, "got 65536")],
    "ip": [(167772171, "non-empty string"), (True, "non-empty string"), ("", "non-empty string"),
           ("10.0.0.256", "not an IPv4 address"), ("::1", "not an IPv4 address"),
           ("1" * 16, "at most 15"), (SURROGATE, "printable"), (ESCAPES, "printable"),
           (HUGE, "at most 15")],
    "mac": [(5, "must be a string"), (True, "must be a string"), (None, "must be a string"),
            ("02:5d:00:00:01", "MAC address"), ("02-5d-00-00-01-00", "MAC address"),
            ("02:5d:00:00:01:0g", "MAC address"), (SURROGATE, "MAC address"),
            (ESCAPES, "MAC address"), (HUGE, "MAC address"), ("02:5d:00:00:01:00 ", "MAC address")],
    "boxes": [(7, "non-empty string"), ("", "non-empty string"), ("b" * 1025, "at most 1024")],
    "rack": [(1, "true or false, got 1"), (0, "true or false, got 0"), ("true", "true or false"),
             (None, "true or false"), ([True], "true or false")],
    "k": [(256.0, "integer, got float"), ("256", "integer, got str"), (True, "integer, got bool"),
          (0, "in 1.."), (wire.MAX_K + 1, f"in 1..{wire.MAX_K}")],
    "lanes": [(0, "in 1..16"), (wire.MAX_LANES + 1, "in 1..16"), (2.0, "integer, got float"),
              (True, "integer, got bool"), (None, "integer")],
    "timeout": [(0, "(0, 600]"), ("5", "(0, 600]"), (True, "(0, 600]"), (601, "(0, 600]"),
                (float("nan"), "(0, 600]"), (float("inf"), "(0, 600]"), (None, "(0, 600]")],
    "weight": [(0, "above zero"), (-1, "above zero"), ("3", "above zero"), (True, "above zero"),
               (float("nan"), "above zero"), (float("inf"), "above zero"), ([1], "above zero")],
    "operator": [(5, "non-empty string"), ("", "non-empty string"), ("t" * 257, "at most 256"),
                 (ESCAPES, "printable"), (None, "non-empty string")],
    "dscp": [(64, "in 0..63"), (-1, "in 0..63"), (1.5, "integer, got float"),
             (True, "integer, got bool"), ("46", "integer, got str")],
    "job_id": [(3.0, "integer, got float"), (True, "integer, got bool"), ("3", "integer, got str"),
               (0, "in 1..255"), (256, "in 1..255")],
}

# (A resumed rank is checked against the running job's world by jobs.py, not here.)
CASES = [(op, field, value, words) for op, good in GOOD.items() for field in good
         if field != "op" for value, words in BAD[field]
         if (op, field, value) != ("resume", "rank", 4)]


def _refusal(msg: dict) -> str:
    with pytest.raises(FieldError) as e:
        validate(msg["op"], msg)
    text = str(e.value)
    assert "\n" not in text and text.isascii() and text.isprintable() and len(text) < 200, text
    json.dumps({"error": text}).encode()   # what the door sends back
    return text


def test_good_requests_pass_and_keep_their_values():
    for op, msg in GOOD.items():
        assert validate(op, msg) == msg


def test_every_field_of_every_op_has_bad_values_here():
    assert {f for schema in SCHEMAS.values() for f in schema} == set(BAD)


@pytest.mark.parametrize("op, field, value, words", CASES,
                         ids=[f"{op}-{field}-{ascii(v)[:12]}" for op, field, v, _ in CASES])
def test_a_bad_field_is_refused_in_one_line(op, field, value, words):
    text = _refusal({**GOOD[op], field: value})
    assert f"'{field}'" in text and words in text, text


@pytest.mark.parametrize("op", [op for op, good in GOOD.items() if len(good) > 1])
def test_required_fields_are_required(op):
    for field in ("job", "world", "rank", "port", "ip", "job_id"):
        if field in GOOD[op]:
            msg = {k: v for k, v in GOOD[op].items() if k != field}
            assert _refusal(msg) == f"'{field}' is required"


def test_defaults_and_nulls():
    bare = {k: v for k, v in GOOD["join"].items()
            if k not in ("token", "mac", "k", "timeout", "rack", "lanes")}
    got = validate("join", bare)
    assert got["token"] is None and got["mac"] == "" and got["k"] is None and got["timeout"] == 60
    assert got["rack"] is False and got["lanes"] == 1
    assert validate("join", {**bare, "token": None, "k": None})["token"] is None
    assert validate("heartbeat", {"op": "heartbeat"}) == {"op": "heartbeat", "token": None}


def test_a_mac_comes_out_in_lower_case():
    assert validate("join", {**GOOD["join"], "mac": "02:5D:AB:cd:EF:00"})["mac"] == "02:5d:ab:cd:ef:00"


@pytest.mark.parametrize("op", list(GOOD))
def test_unknown_fields_are_refused_with_the_known_ones_named(op):
    text = _refusal({**GOOD[op], "k" if op != "join" else "extra": 1})
    assert text.startswith("unknown field ") and f"in {op}; its fields are" in text
    text = _refusal({**GOOD[op], ESCAPES + SURROGATE + HUGE: 1})
    assert "\\x1b" in text and "\x1b" not in text


def test_a_refused_value_is_shown_short_and_escaped():
    text = _refusal({**GOOD["join"], "ip": "10.0.0.\u00e9"})
    assert text.endswith("'10.0.0.\\xe9'"), text
    text = _refusal({**GOOD["join"], "mac": HUGE})
    assert len(text) < 150 and text.endswith("...")
