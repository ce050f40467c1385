"""`swml-switch status` from fake samples: one switch by IFACE, 80 columns,
zero counters only with --all, the job's multicast group, and nothing a
client sent (or an older state file holds) printed raw. Against a running
switch: tests/lab/test_operations.py."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from switchml_xdp import wire
from switchml_xdp.cli import status_view
from switchml_xdp.cli import switch as switch_cli
from switchml_xdp.switch.rates import add_rates

HOSTILE = "\x1b]0;owned\x07\x1b[2J\x9b\u202e\ud800\\"   # title, clear, CSI, bidi, surrogate


def _state(iface: str = "sw0", t: float = 10.0, rx: int = 1000, mac: str = "02:5d:00:00:01:00",
           name: str = "train") -> dict:
    counters = dict.fromkeys(wire.COUNTER_NAMES, 0)
    counters.update(rx=rx, completed=rx // 2, bad_source=7)
    return {"iface": iface, "pid": 42, "started": 1.0, "sampled_at": t, "alive": True,
            "label": "native XDP", "fanout": "unicast",
            "params": {"k": 256, "slots": 1024, "port": wire.DEFAULT_PORT},
            "ip": "10.100.200.250", "control_port": wire.DEFAULT_CONTROL_PORT, "counters": counters,
            "jobs": [{"id": 3, "name": name, "world": 64, "state": "running", "slot_base": 65408,
                      "slots": 127, "protected": False,
                      "group": {"ip": "239.77.0.3", "mac": "01:00:5e:4d:00:03"},
                      "members": {"63": {"ip": "10.100.200.251", "port": 65535, "mac": mac,
                                         "left": True, "learnt_mac": "02:5d:00:00:01:3f"}}},
                     {"id": None, "name": "j" * 64, "world": 2, "state": "joining",
                      "slot_base": None, "slots": 0, "group": {"ip": None, "mac": None},
                      "members": {}}],
            "job_stats": {"3": {"packets": rx, "bytes": rx * 1000, "results": rx // 2,
                                "shadow_replies": 0}},
            "note": "counters: " + "a long note " * 12 + "the end"}


def _sampled(**kw) -> dict:
    return add_rates([_state(t=10.0, **kw)], [_state(t=11.0, rx=3000, **kw)])[0]


def _frame(st: dict, width: int = 80, show_all: bool = False) -> str:
    from rich.console import Console

    console = Console(record=True, width=width, color_system=None)
    console.print(status_view.render_frame([st], show_all))
    return console.export_text()


def _assert_safe(text: str) -> None:
    text.encode("utf-8")   # strict: an unpaired surrogate raises
    bad = [c for c in text if not c.isprintable() and c != "\n"]
    assert not bad, bad


def test_text_fits_80_columns_with_long_names_addresses_and_every_counter():
    for show_all in (False, True):
        text = status_view.format_text(_sampled(), show_all)
        assert max(len(line) for line in text.splitlines()) <= 80, text
        assert "j" * 64 in text and "\n          RESULTs to 02:5d:00:00:01:3f\n" in text
        assert text.endswith("the end")   # the command's own note is never cut


def test_zero_counters_only_with_all():
    text = status_view.format_text(_sampled())
    assert "rx 3000" in text and "bad_source 7" in text
    assert "aggregated" not in text and "bad_ip" not in text and "stale" not in text
    text = status_view.format_text(_sampled(), show_all=True)
    assert "aggregated 0" in text and "bad_ip 0" in text and "stale 0.0" in text
    frame = _frame(_sampled())
    assert "bad_source" in frame and "bad_ip" not in frame
    assert "bad_ip" in _frame(_sampled(), show_all=True)


def test_nothing_dropped_says_none():
    st = _sampled()
    st["counters"]["bad_source"] = 0
    st["rates"]["drops"] = dict.fromkeys(st["rates"]["drops"], 0.0)
    text = status_view.format_text(st)
    assert "  dropped: none" in text and "  dropped per second: none" in text
    assert "dropped: reason" in _frame(st) and "none" in _frame(st)


def test_the_jobs_multicast_group_is_shown():
    text = status_view.format_text(_sampled())
    row = next(line for line in text.splitlines() if " train " in line)
    assert row.split()[-1] == "239.77.0.3", row
    assert "239.77.0.3" in _frame(_sampled(), width=160)


def test_an_older_state_file_without_group_or_fields_is_shown():
    st = _state()
    for j in st["jobs"]:
        j.pop("group"), j.pop("protected", None)
    st.pop("fanout")
    assert " train " in status_view.format_text(st)


@pytest.mark.parametrize("where", ["mac", "name"])
def test_what_a_client_sent_never_reaches_the_output_raw(where, monkeypatch):
    st = _sampled(**{where: HOSTILE})
    text = status_view.format_text(st)
    _assert_safe(text)
    assert "\\x1b]0;owned\\x07" in text and "\\ud800" in text and "\\\\" in text
    _assert_safe(_frame(st, width=200))
    assert where == "mac" or "\\x1b" in _frame(st, width=200)   # the live view shows no MACs
    # The command itself, as a user runs it.
    monkeypatch.setattr(status_view, "sample_with_rates", lambda interval, iface=None: [st])
    r = CliRunner().invoke(switch_cli.main, ["status"])
    assert r.exit_code == 0, r.output
    _assert_safe(r.output)
    r = CliRunner().invoke(switch_cli.main, ["status", "--json"])
    assert r.exit_code == 0 and r.output.isascii(), r.output
    assert json.loads(r.output)["switches"][0]["jobs"][0]["members"]["63"]["mac"] == (
        HOSTILE if where == "mac" else "02:5d:00:00:01:00")


def test_status_iface_shows_that_switch_only(monkeypatch):
    states = [dict(_state("sw0"), dataplane="userspace"), dict(_state("sw1"), dataplane="userspace")]
    monkeypatch.setattr(status_view.state_files, "all_states", lambda: [dict(s) for s in states])
    monkeypatch.setattr(status_view.state_files, "lock_holder", lambda iface: None)
    assert [s["iface"] for s in status_view.collect_status()] == ["sw0", "sw1"]
    assert [s["iface"] for s in status_view.collect_status("sw1")] == ["sw1"]
    r = CliRunner().invoke(switch_cli.main, ["status", "sw1", "--interval", "0"])
    assert r.exit_code == 0 and "switch sw1:" in r.output and "sw0" not in r.output, r.output
    r = CliRunner().invoke(switch_cli.main, ["status", "eth9\x1b[2J", "--interval", "0"])
    assert r.exit_code == 1 and r.output.strip() == "Error: no switch is up on eth9\\x1b[2J"


def test_the_metrics_name_the_jobs_group():
    from prometheus_client import CollectorRegistry, generate_latest

    from switchml_xdp.switch.metrics import SwitchCollector

    st = _state()
    snap = {k: st[k] for k in ("counters", "job_stats", "jobs")}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SwitchCollector(lambda: snap, "sw0"))
    text = generate_latest(reg).decode()
    assert 'swml_job_group_info{group="239.77.0.3",iface="sw0",job="train",job_id="3"} 1.0' in text
    assert text.count("swml_job_group_info{") == 1   # a joining job has no group yet
