"""`swml-switch job NAME --weight W [--dscp D]` against a stand-in daemon on
the loopback: what it sends (the operator token, the values), the line it
prints, bad values refused before anything is sent in the daemon's words,
one line for a refusal, no token, no switch or several. Against a real
switch, as root and as another user: tests/lab/test_lab_shares_operator.py."""
from __future__ import annotations

import json
import socket
import threading

import pytest
from click.testing import CliRunner

from switchml_xdp.cli import switch as switch_cli
from switchml_xdp.cli import switch_job
from switchml_xdp.switch.share_policy import parse_weight

TOKEN = "0123456789abcdef0123456789abcdef"
SHARE = {"policy": "weighted", "weight": 1.0, "share": 0.5, "target_bps": 50_000_000,
         "actual_bps": 49_000_000, "remaining_bytes": 0, "dscp": 34}


class StubDaemon:
    """Answers `status` and `job` as the daemon does: every request kept."""

    def __init__(self, iface: str = "sw0", max_weight: float = 8.0):
        self.iface, self.max_weight, self.requests = iface, max_weight, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rwb") as f:
                for line in f:
                    msg = json.loads(line)
                    self.requests.append(msg)
                    f.write((json.dumps(self._answer(msg)) + "\n").encode())
                    f.flush()

    def _answer(self, msg: dict) -> dict:
        if msg["op"] == "status":
            return {"ok": True, "switch": {"iface": self.iface},
                    "jobs": [{"name": "train", "share": SHARE}]}
        if msg["operator"] != TOKEN:
            return {"ok": False, "error": "not the operator's token: only root on the box (which "
                                          "reads /run/swml/sw0.operator) may change a job's share"}
        if msg["job"] != "train":
            return {"ok": False, "error": f"no job {msg['job']!r} on this box"}
        try:
            weight = parse_weight(msg["weight"], self.max_weight) if msg["weight"] else 1.0
        except ValueError as e:
            return {"ok": False, "error": str(e)}
        return {"ok": True, "job": "train", "weight": weight, "dscp": msg["dscp"]}

    def state(self) -> dict:
        return {"iface": self.iface, "ip": "127.0.0.1", "control_port": self.port}

    def ops(self) -> list[str]:
        return [m["op"] for m in self.requests]


@pytest.fixture
def daemon(monkeypatch, tmp_path):
    """One stand-in switch up on this machine, its operator token where
    the daemon writes it (a state dir of the test's own)."""
    stub = StubDaemon()
    monkeypatch.setattr(switch_job.state_files, "STATE_DIR", str(tmp_path))
    (tmp_path / "sw0.operator").write_text(TOKEN + "\n")
    monkeypatch.setattr(switch_job.state_files, "all_states", lambda: [stub.state()])
    monkeypatch.setattr(switch_job.state_files, "lock_holder", lambda iface: 42)
    yield stub
    stub.sock.close()


def run(*args) -> tuple[int, str]:
    r = CliRunner().invoke(switch_cli.main, ["job", *args])
    return r.exit_code, r.output


def one_error(code: int, out: str) -> str:
    assert code == 1 and "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out
    return lines[0][len("Error: "):]


def test_the_weight_is_sent_with_the_operator_token_and_the_change_said(daemon):
    code, out = run("train", "--weight", "3")
    assert (code, out) == (0, "job train: weight 3 (was 1)\n")
    job = daemon.requests[-1]
    assert job == {"op": "job", "operator": TOKEN, "job": "train", "weight": 3.0, "dscp": None}


def test_a_pinned_mark_and_a_weight_at_once(daemon):
    code, out = run("train", "--weight", "2.5", "--dscp", "46")
    assert (code, out) == (0, "job train: weight 2.5 (was 1), dscp 46 pinned (was 34)\n")
    assert daemon.requests[-1]["dscp"] == 46


@pytest.mark.parametrize("bad", ["0", "-1", "x", "nan", "inf", "-0", "1e999", ""])
def test_a_bad_weight_is_refused_in_the_daemons_words_before_anything_is_sent(daemon, bad):
    with pytest.raises(ValueError) as daemon_words:
        parse_weight(bad)
    assert one_error(*run("train", "--weight", bad)) == str(daemon_words.value)
    assert daemon.requests == []


@pytest.mark.parametrize("bad, says", [("64", "not 64"), ("-1", "not -1"), ("x", "not 'x'"),
                                       ("4.5", "not '4.5'")])
def test_a_bad_mark_is_refused_before_anything_is_sent(daemon, bad, says):
    assert one_error(*run("train", "--dscp", bad)) == f"a DSCP mark is an integer 0..63, {says}"
    assert daemon.requests == []


def test_nothing_to_set_is_one_line(daemon):
    assert "--weight W, --dscp D or both" in one_error(*run("train"))
    assert daemon.requests == []


@pytest.mark.parametrize("args, says", [
    (["nosuch", "--weight", "2"], "no job 'nosuch' on this box"),
    (["train", "--weight", "9"], "weight 9 is above this box's cap of 8 (swml-switch up "
                                 "--max-weight)"),
])
def test_the_daemons_refusal_is_its_one_line(daemon, args, says):
    assert one_error(*run(*args)) == says
    assert daemon.ops() == ["status", "job"]


def test_a_wrong_token_is_the_daemons_refusal(daemon, tmp_path):
    (tmp_path / "other").write_text("f" * 32)
    says = one_error(*run("train", "--weight", "2", "--token-file", str(tmp_path / "other")))
    assert says.startswith("not the operator's token: only root on the box")


def test_an_unreadable_token_says_only_root_may_and_sends_nothing(daemon, tmp_path):
    (tmp_path / "sw0.operator").unlink()
    says = one_error(*run("train", "--weight", "2"))
    assert says == (f"only root on the box may change a job's share (cannot read "
                    f"{tmp_path}/sw0.operator: No such file or directory)")
    says = one_error(*run("train", "--weight", "2", "--token-file", str(tmp_path)))
    assert says.startswith("only root on the box may change a job's share (cannot read ")
    assert daemon.requests == []


def test_which_switch(daemon, monkeypatch):
    other = dict(daemon.state(), iface="sw1")
    monkeypatch.setattr(switch_job.state_files, "all_states", lambda: [daemon.state(), other])
    assert one_error(*run("train", "--weight", "2")) == (
        "switches are up on sw0, sw1: say which with --iface")
    assert one_error(*run("train", "--weight", "2", "--iface", "eth9\x1b[2J")) == (
        "no switch is up on eth9\\x1b[2J")
    assert run("train", "--weight", "2", "--iface", "sw0")[0] == 0
    # of several, the one in this network namespace (a lab's beside others)
    monkeypatch.setattr(switch_job, "netns_inode", lambda: 7)
    other["netns_inode"] = 7
    says = one_error(*run("train", "--weight", "2"))
    assert says.endswith("sw1.operator: No such file or directory)"), says
    monkeypatch.setattr(switch_job.state_files, "all_states",
                        lambda: [other, dict(daemon.state(), iface="sw2", netns_inode=7)])
    assert one_error(*run("train", "--weight", "2")) == (
        "switches are up on sw1, sw2: say which with --iface")
    monkeypatch.setattr(switch_job.state_files, "lock_holder", lambda iface: None)
    assert one_error(*run("train", "--weight", "2")) == "no switch is up on this machine"


def test_a_control_port_out_of_reach_is_one_line(daemon, monkeypatch):
    monkeypatch.setattr(switch_job.status_view, "daemon_status", lambda st: None)
    says = one_error(*run("train", "--weight", "2"))
    assert says.startswith(f"cannot reach the control port 127.0.0.1:{daemon.port} of the switch "
                           f"on sw0 from here")
    assert daemon.requests == []
