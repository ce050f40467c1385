"""Running a switch, without one: config files, every option's help, the
version, the systemd unit's command line, metrics, rates and the status
watch view from samples. Against a running switch: tests/lab/test_operations.py."""
from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from switchml_xdp import wire
from switchml_xdp.cli import lab as lab_cli
from switchml_xdp.cli import status_view, switch_config
from switchml_xdp.cli import switch as switch_cli
from switchml_xdp.cli import worker as worker_cli
from switchml_xdp.switch.rates import add_rates, switch_rates


@pytest.mark.parametrize("module", ["switch", "worker", "lab"])
def test_every_cli_says_its_version(module):
    r = subprocess.run([sys.executable, "-m", f"switchml_xdp.cli.{module}", "--version"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert importlib.metadata.version("switchml-xdp") in r.stdout


def test_every_option_has_help():
    missing = []
    for prog, group in CLIS.items():
        for where, cmd in _commands(group, prog):
            for p in cmd.params:
                if isinstance(p, click.Option) and not p.help:
                    missing.append(f"{where} {p.opts[-1]}")
    assert not missing, f"options without help text: {missing}"


@pytest.mark.parametrize("address, says", [
    ("10.0.0.999", "'10.0.0.999' is not an IPv4 address"),
    ("10.0.0", "'10.0.0' is not an IPv4 address"),
    ("no-such-host.invalid", "neither an IPv4 address nor a host name"),
])
def test_malformed_switch_address_is_one_clear_line(address, says):
    r = CliRunner().invoke(worker_cli.main, ["bench", "--switch", address, "--job", "j",
                                             "--rank", "0", "--world", "2"])
    assert r.exit_code == 2
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error:") and "--switch" in last and says in last, r.output
    assert "Traceback" not in r.output


def test_bench_help_explains_the_columns():
    r = CliRunner().invoke(worker_cli.main, ["bench", "--help"])
    assert r.exit_code == 0
    for column in ("TAT", "Gbit/s", "ATE/s", "retx", "verify"):
        assert re.search(rf"^\s+{re.escape(column)}\s+\S", r.output, re.M), column


def test_readme_and_makefile_run_the_same_bench():
    readme = (ROOT / "README.md").read_text()
    said = re.search(r"`make bench`, i\.e\. `python (-m switchml_xdp\.bench\.switch_cost[^`]*)`", readme)
    assert said, "README says what `make bench` runs"
    recipe = re.search(r"^bench:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert " ".join(said.group(1).split()) in recipe, (said.group(1), recipe)


def test_rates_are_differences_over_time():
    r = switch_rates(_sample(10.0, 1000, 5, 1000), _sample(12.0, 5000, 25, 3000))
    assert r["interval_s"] == 2.0
    assert r["counters"]["rx"] == 2000 and r["drops"]["bad_source"] == 10
    job = r["jobs"]["3"]
    assert job["packets_per_s"] == 1000 and job["completions_per_s"] == 500
    assert job["retransmissions_answered_per_s"] == 10
    assert job["gbit_per_s"] == pytest.approx(1000 * 1000 * 8 / 1e9)
    # A restarted daemon (another start time) gives no rates, never negative ones.
    assert switch_rates(_sample(10.0, 9000, 5, 1000), _sample(12.0, 10, 0, 0, started=2.0)) is None
    # Without per-job counters (a data plane without read_job_stats): no job rates, said so.
    later = add_rates([_sample(10.0, 1000, 5, None)], [_sample(11.0, 2000, 5, None)])[0]
    assert later["rates"]["jobs"] == {} and not later["rates"]["per_job"]
    assert "does not count packets per job" in status_view.format_text(later)


def test_job_stats_come_from_the_data_plane_where_it_counts_them():
    from switchml_xdp.switch.daemon import read_job_stats

    class Counting:
        def read_job_stats(self):
            return {3: {"packets": 10, "bytes": 1000, "results": 5, "shadow_replies": 1}}

    assert read_job_stats(Counting()) == {"3": {"packets": 10, "bytes": 1000, "results": 5,
                                                "shadow_replies": 1}}
    assert read_job_stats(object()) is None   # a data plane without per-job counters


def test_watch_renders_a_frame_with_rates():
    from rich.console import Console

    st = add_rates([_sample(10.0, 1000, 5, 1000)], [_sample(11.0, 3000, 8, 4000)])[0]
    console = Console(record=True, width=160, color_system=None)
    console.print(status_view.render_frame([st]))
    text = console.export_text()
    assert "train" in text and "pkt/s" in text and "retx ans/s" in text
    assert re.search(r"train\s+2\s+1\s+running\s+3000\s+0\.024\s+1500\s+30\b", text), text
    assert re.search(r"bad_source\s+3\.0\s+8\b", text), text


def test_watch_loop_redraws_with_rates(monkeypatch):
    from rich.console import Console

    samples = iter([[_sample(0.0, 0, 0, 0)], [_sample(0.5, 500, 1, 800)]])
    monkeypatch.setattr(status_view, "collect_status", lambda iface=None: next(samples))
    console = Console(record=True, width=160, color_system=None, force_terminal=False)
    status_view.watch(0.01, count=1, console=console)
    text = console.export_text()
    assert re.search(r"train\s+2\s+1\s+running\s+1600\b", text), text


def test_metrics_collector_exports_counters_jobs_and_slots():
    from prometheus_client import CollectorRegistry, generate_latest

    from switchml_xdp.switch.metrics import SwitchCollector

    st = _sample(0.0, 700, 4, 300)
    snap = {"counters": st["counters"], "job_stats": st["job_stats"], "jobs": st["jobs"],
            "slots_total": 1024, "slots_free": 896}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SwitchCollector(lambda: snap, "sw0"))
    text = generate_latest(reg).decode()
    assert 'swml_packets_total{iface="sw0",outcome="rx"} 700.0' in text
    assert 'swml_dropped_packets_total{iface="sw0",reason="bad_source"} 4.0' in text
    assert 'swml_job_packets_total{iface="sw0",job="train",job_id="3"} 300.0' in text
    assert 'swml_job_bytes_total{iface="sw0",job="train",job_id="3"} 300000.0' in text
    assert 'swml_jobs{iface="sw0",state="running"} 1.0' in text
    assert 'swml_job_members{iface="sw0",job="train",job_id="3"} 1.0' in text
    assert 'swml_slots_in_use{iface="sw0"} 128.0' in text


@pytest.mark.parametrize("text, expected", [("9100", ("0.0.0.0", 9100)),
                                            ("127.0.0.1:9100", ("127.0.0.1", 9100))])
def test_metrics_listen_address(text, expected):
    from switchml_xdp.switch.metrics import parse_listen

    assert parse_listen(text) == expected
    with pytest.raises(ValueError):
        parse_listen("99999")


def test_config_file_gives_the_options_and_the_command_line_wins(tmp_path, captured_up):
    cfg = tmp_path / "switch.toml"
    cfg.write_text('iface = "eth7"\nelements = 64\nslots = 512\nrequire-token = true\n'
                   'metrics = "127.0.0.1:9109"\njob-slots = 32\nfanout = "unicast"\n'
                   'capacity = "40G"\n')
    # The systemd unit's form: everything from the file.
    r = CliRunner().invoke(switch_cli.main, ["up", "--config", str(cfg)])
    assert r.exit_code == 0, r.output
    assert captured_up["iface"] == "eth7" and captured_up["params"].k == 64
    assert captured_up["params"].slots == 512 and captured_up["job_slots"] == 32
    assert captured_up["require_token"] is True and captured_up["metrics"] == ("127.0.0.1", 9109)
    assert captured_up["fanout"] == "unicast" and captured_up["capacity_bps"] == 40 * 10**9
    r = CliRunner().invoke(switch_cli.main, ["up", "--config", str(cfg), "eth9", "-k", "128",
                                             "--fanout", "multicast"])
    assert r.exit_code == 0, r.output
    assert captured_up["iface"] == "eth9" and captured_up["params"].k == 128
    assert captured_up["params"].slots == 512 and captured_up["fanout"] == "multicast"


def test_up_takes_the_ports_of_a_box_the_first_naming_it(captured_up):
    r = CliRunner().invoke(switch_cli.main, ["up", "eth1", "eth2", "eth3", "--fanout", "unicast"])
    assert r.exit_code == 0, r.output
    assert captured_up["iface"] == "eth1" and captured_up["ports"] == ["eth1", "eth2", "eth3"]
    r = CliRunner().invoke(switch_cli.main, ["up", "eth1"])
    assert r.exit_code == 0 and captured_up["ports"] == ["eth1"], r.output


@pytest.mark.parametrize("bad", ["0", "-1G", "40Q", "fast"])
def test_a_bad_capacity_is_one_clear_error(captured_up, bad):
    r = CliRunner().invoke(switch_cli.main, ["up", "eth1", "--capacity", bad])
    assert r.exit_code == 2 and "--capacity" in r.output and "rate" in r.output, r.output
    assert "Traceback" not in r.output


def test_the_systemd_units_command_line_works(tmp_path, captured_up):
    unit = (ROOT / "packaging/swml-switch.service")
    if not unit.exists():
        pytest.skip("no packaging/swml-switch.service in this tree")
    argv = re.search(r"^ExecStart=(.*)$", unit.read_text(), re.M).group(1).split()
    assert argv[:2] == ["/usr/local/bin/swml-switch", "up"] and "--config" in argv
    cfg = tmp_path / "switch.toml"
    cfg.write_text('iface = "eth1"\nrequire-token = true\n')
    args = [str(cfg) if a == "/etc/swml/switch.toml" else a for a in argv[2:]]
    r = CliRunner().invoke(switch_cli.main, ["up", *args])
    assert r.exit_code == 0, r.output
    assert captured_up["iface"] == "eth1" and captured_up["require_token"] is True


def test_default_config_file_is_read_when_it_exists(tmp_path, captured_up, monkeypatch):
    cfg = tmp_path / "switch.toml"
    cfg.write_text('iface = "eth3"\nlease = 7.5\n')
    monkeypatch.setattr(switch_config, "DEFAULT_CONFIG", str(cfg))
    r = CliRunner().invoke(switch_cli.main, ["up"])
    assert r.exit_code == 0, r.output
    assert captured_up["iface"] == "eth3" and captured_up["lease"] == 7.5


@pytest.mark.parametrize("content, says", [
    ('iface = "eth0"\nelement = 64\n', "unknown key 'element'"),
    ('iface = "eth0"\nelements = 999\n', "elements: 999 is not in the range"),
    ('iface = "eth0"\nmode = "offload"\n', "mode: 'offload' is not one of"),
    ('iface = "eth0"\nfanout = "broadcast"\n', "fanout: 'broadcast' is not one of"),
    ('iface = "eth0"\nrequire-token = "yes"\n', "require-token: true or false"),
    ('iface = "eth0"\nmetrics = "x:70000"\n', "metrics:"),
    ('iface = \n', "not valid TOML"),
])
def test_bad_config_is_one_line(tmp_path, captured_up, content, says):
    cfg = tmp_path / "switch.toml"
    cfg.write_text(content)
    r = CliRunner().invoke(switch_cli.main, ["up", "--config", str(cfg)])
    assert r.exit_code == 1 and not captured_up
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {cfg}: ") and says in lines[0], r.output


def test_up_without_an_interface_says_where_to_give_one(captured_up):
    r = CliRunner().invoke(switch_cli.main, ["up"])
    assert r.exit_code == 2 and "give IFACE" in r.output


def test_bench_report_explains_its_failed_cells():
    from switchml_xdp.bench.report import failures, markdown

    doc = json.loads((ROOT / "bench/results/lab_bench.json").read_text())
    text = markdown(doc)
    failed = [r for r in doc["results"] if r["status"].startswith("failed")
              and r["status"] != "failed: see above"]
    section = text.split("## Failures", 1)[1].split("## Definitions", 1)[0] if failed else ""
    for r in failed:
        assert f"N={r['workers']}, k={r['k']}, loss {r['loss'] * 100:g}%" in section
    assert "not run" in text or not any(r["status"] == "failed: see above" for r in doc["results"])
    # The tracked report carries the section (its headings keep the header sizes of
    # the wire format it was measured with, so only the section is compared).
    assert "\n".join(failures(doc)) in (ROOT / "bench/results/lab_bench.md").read_text()


from repo import REPO as ROOT  # noqa: E402 - beside the constants that use it

CLIS = {"swml-switch": switch_cli.main, "swml-worker": worker_cli.main, "swml-lab": lab_cli.main}


def _commands(group: click.Group, path: str):
    for name, cmd in group.commands.items():
        yield f"{path} {name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{path} {name}")


def _sample(t: float, rx: int, drops: int, job_packets: int | None, started: float = 1.0) -> dict:
    counters = dict.fromkeys(wire.COUNTER_NAMES, 0)
    counters.update(rx=rx, completed=rx // 2, bad_source=drops)
    st = {"iface": "sw0", "pid": 42, "started": started, "sampled_at": t, "alive": True,
          "label": "native XDP", "params": {"k": 256, "slots": 1024, "port": wire.DEFAULT_PORT},
          "ip": "10.0.0.1", "control_port": wire.DEFAULT_CONTROL_PORT,
          "counters": counters,
          "jobs": [{"id": 3, "name": "train", "world": 2, "state": "running", "slot_base": 0,
                    "slots": 128, "members": {"0": {"ip": "10.0.0.11", "port": 1, "mac": "m",
                                                    "left": False}}, "protected": True}],
          "job_stats": None}
    if job_packets is not None:
        st["job_stats"] = {"3": {"packets": job_packets, "bytes": job_packets * 1000,
                                 "results": job_packets // 2, "shadow_replies": job_packets // 100}}
    return st


@pytest.fixture
def captured_up(monkeypatch):
    """`swml-switch up` without a switch: what it would have run."""
    seen = {}

    def make_dataplane(name, iface, params, mode, fanout, ports, uplink=None):
        seen.update(dataplane=name, iface=iface, params=params, mode=mode, fanout=fanout,
                    ports=ports, uplink=uplink)
        return object()

    def run(dp, control_port, job_slots, lease, require_token, initial_seq=0, metrics=None,
            auth="header", capacity_bps=None, parent=None, share=None):
        seen.update(control_port=control_port, job_slots=job_slots, lease=lease,
                    require_token=require_token, initial_seq=initial_seq, metrics=metrics,
                    auth=auth, capacity_bps=capacity_bps, parent=parent, share=share)
        return {}

    monkeypatch.setattr(switch_cli.daemon, "make_dataplane", make_dataplane)
    monkeypatch.setattr(switch_cli.daemon, "run", run)
    monkeypatch.setattr(switch_config, "DEFAULT_CONFIG", "/nonexistent/swml/switch.toml")
    return seen
