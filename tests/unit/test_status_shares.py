"""What `swml-switch status` and the metrics show of a box started with
`--share`: the box's policy in the headline, each running job's part,
weight, target and actual rates, what is left and its mark; nothing added
without shares; the live parts from the daemon, never the state file's
stale ones. Against a running switch: tests/lab/test_lab_shares_operator.py."""
from __future__ import annotations

import re

from switchml_xdp import wire
from switchml_xdp.cli import status_view

SHARES = {"policy": "weighted", "capacity_bps": 100_000_000, "max_weight": 8.0,
          "dscp": [46, 34, 26, 0]}
SHARE = {"policy": "weighted", "weight": 3.0, "share": 0.75, "target_bps": 75_000_000,
         "actual_bps": 73_200_000, "remaining_bytes": 12 << 20, "dscp": 46}
LINE = "share 0.75 (weight 3) target 75.0 Mbit/s actual 73.2 Mbit/s left 12.0 MiB dscp 46"


def _state(name: str = "train", shares: bool = True) -> dict:
    job = {"id": 3, "name": name, "world": 2, "state": "running", "slot_base": 0, "slots": 96,
           "protected": True, "group": {"ip": "239.77.0.3", "mac": "01:00:5e:4d:00:03"},
           "members": {}}
    if shares:
        job["share"] = dict(SHARE)
    return {"iface": "sw0", "pid": 42, "started": 1.0, "sampled_at": 1.0, "alive": True,
            "label": "native XDP", "dataplane": "xdp", "fanout": "multicast",
            "params": {"k": 256, "slots": 128, "port": wire.DEFAULT_PORT}, "ip": "10.0.0.1",
            "control_port": wire.DEFAULT_CONTROL_PORT, "capacity_bps": 100_000_000,
            "counters": dict.fromkeys(wire.COUNTER_NAMES, 0), "jobs": [job],
            "shares": dict(SHARES) if shares else None}


def _frame(st: dict) -> str:
    from rich.console import Console

    console = Console(record=True, width=100, color_system=None)
    console.print(status_view.render_frame([st]))
    return console.export_text()


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_each_job_shows_its_part_and_the_box_its_policy():
    text = status_view.format_text(_state())
    lines = text.splitlines()
    row = next(i for i, ln in enumerate(lines) if " train " in ln)
    # under the job's row, wrapped between its pieces, never inside one
    assert lines[row + 1:row + 3] == [
        "        share 0.75 (weight 3) target 75.0 Mbit/s actual 73.2 Mbit/s",
        "            left 12.0 MiB dscp 46"], text
    assert ("  shares weighted of 100 Mbit/s, weights up to 8, dscp classes 46,34,26,0"
            in lines), text
    assert max(map(len, lines)) <= 80
    frame = _flat(_frame(_state()))
    assert f"train: {LINE}" in frame and "shares weighted of 100 Mbit/s" in frame


def test_a_part_without_what_is_left_or_a_mark_says_neither():
    st = _state()
    st["jobs"][0]["share"].update(remaining_bytes=0, dscp=None, actual_bps=0, share=1.0)
    assert ("        share 1.00 (weight 3) target 75.0 Mbit/s actual 0 bit/s"
            in status_view.format_text(st).splitlines())


def test_without_shares_nothing_is_added():
    text = status_view.format_text(_state(shares=False))
    assert "share" not in text and "weight" not in text
    assert "share" not in _frame(_state(shares=False))


def test_a_hostile_name_beside_a_share_is_escaped():
    text = status_view.format_text(_state(name="t\x1b[2J"))
    assert "t\\x1b[2J" in text and "\x1b" not in text and LINE in _flat(text)
    assert "\x1b" not in _frame(_state(name="t\x1b[2J"))


def test_root_gets_the_daemons_live_parts_not_the_state_files(monkeypatch):
    """Root reads the counters from the pins and the jobs from the state file,
    whose parts are as they were at its last change: the live ones come from
    the daemon, and none are shown where it cannot be reached."""
    stale = _state()
    stale["jobs"][0]["share"]["actual_bps"] = 1
    live = _state()["jobs"]
    monkeypatch.setattr(status_view.os, "geteuid", lambda: 0)
    monkeypatch.setattr(status_view.state_files, "all_states", lambda: [stale])
    monkeypatch.setattr(status_view.state_files, "lock_holder", lambda iface: 42)
    monkeypatch.setattr(status_view.SwitchMaps, "exist", staticmethod(lambda iface: True))
    monkeypatch.setattr(status_view, "_from_pins", lambda st: True)
    monkeypatch.setattr(status_view, "daemon_status",
                        lambda st: {"jobs": live, "shares": SHARES})
    st = status_view.collect_status()[0]
    assert st["jobs"][0]["share"] == SHARE and st["shares"] == SHARES
    stale["jobs"][0]["share"] = dict(SHARE, actual_bps=1)
    monkeypatch.setattr(status_view, "daemon_status", lambda st: None)
    st = status_view.collect_status()[0]
    assert "share" not in st["jobs"][0]
    # Another user, out of the daemon's reach: the state file only, no parts.
    stale["jobs"][0]["share"] = dict(SHARE, actual_bps=1)
    monkeypatch.setattr(status_view.os, "geteuid", lambda: 1000)
    st = status_view.collect_status()[0]
    assert "share" not in st["jobs"][0] and "cannot be reached" in st["note"]


def test_the_metrics_export_each_jobs_part_weight_and_rates():
    from prometheus_client import CollectorRegistry, generate_latest

    from switchml_xdp.switch.metrics import SwitchCollector

    def scrape(st):
        snap = {k: st[k] for k in ("counters", "jobs", "shares")}
        reg = CollectorRegistry(auto_describe=False)
        reg.register(SwitchCollector(lambda: snap, "sw0"))
        return generate_latest(reg).decode()

    text = scrape(_state())
    labels = '{iface="sw0",job="train",job_id="3"}'
    for metric, value in (("swml_job_share", "0.75"), ("swml_job_weight", "3.0"),
                          ("swml_job_target_bits_per_second", "7.5e+07"),
                          ("swml_job_actual_bits_per_second", "7.32e+07"),
                          ("swml_job_remaining_bytes", "1.2582912e+07")):
        assert f"{metric}{labels} {value}" in text, metric
    assert 'swml_share_capacity_bits_per_second{iface="sw0",policy="weighted"} 1e+08' in text
    assert not re.search(r"swml_(job_share|job_weight|share_capacity)\b", scrape(_state(shares=False)))
