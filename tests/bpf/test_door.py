"""The door to the kernel (switchml_xdp.bpf, switchml_xdp.net): compile errors,
attach/detach/query with and without the native-to-generic fallback, inside a
throwaway network namespace, BPF links, pins and program statistics.

Fast: each test compiles at most one small program; the namespace holds one
veth pair and its loopback, nothing else.
"""
from __future__ import annotations

import ctypes as ct
import errno
import os
import secrets
import socket
import subprocess
import threading

import pytest

from requires import NO_LAB, needs_lab
from switchml_xdp import bpf, layout, net
from switchml_xdp.switch.xdp_dataplane import address_defines

PASS = "lab/swml_pass.c"  # kernel tests skip where the lab would (root, bcc, BTF)


# ------------------------------------------------------------ pure helpers


# ------------------------------------------------------------ kernel fixtures

@pytest.fixture
def netns_pair():
    """A throwaway namespace holding veth pair (a, b), both up: 10.9.0.1/24, 10.9.1.1/24."""
    if NO_LAB:
        pytest.skip(NO_LAB)
    ns = f"swmldoor{secrets.token_hex(3)}"
    a, b = f"{ns}a"[-15:], f"{ns}b"[-15:]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        def ip(*args):
            subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        for dev, addr in ((a, "10.9.0.1/24"), (b, "10.9.1.1/24")):
            ip("addr", "add", addr, "dev", dev)
            ip("link", "set", dev, "up")
        ip("link", "set", "lo", "up")
        yield ns, a, b
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.fixture(scope="module")
def pass_prog():
    if NO_LAB:
        pytest.skip(NO_LAB)
    with bpf.compile_program(PASS, "swml_pass") as prog:
        yield prog


# ------------------------------------------------------------ compiling

@needs_lab
def test_compile_error_is_one_line_with_the_compiler_s_words(tmp_path):
    src = tmp_path / "broken.c"
    src.write_text("#include <uapi/linux/bpf.h>\nint p(struct xdp_md *ctx) { return nope; }\n")
    with pytest.raises(bpf.BpfError) as e:
        bpf.compile_program(src, "p")
    msg = str(e.value)
    assert "\n" not in msg and "broken.c" in msg and "undeclared identifier 'nope'" in msg
    assert "error:" in e.value.log


@needs_lab
def test_verifier_rejection_is_one_line_with_the_verifier_s_words(tmp_path):
    src = tmp_path / "unsafe.c"
    src.write_text("#include <uapi/linux/bpf.h>\n"
                   "int p(struct xdp_md *ctx) { return *(int *)(long)ctx->data; }\n")
    with pytest.raises(bpf.BpfError) as e:
        bpf.compile_program(src, "p")
    msg = str(e.value)
    assert "\n" not in msg and "cannot load p" in msg and "outside of the packet" in msg


@needs_lab
def test_bcc_loads_no_bpf_loop_callback(tmp_path):
    """What holds k at one page's worth (docs/performance.md, "Larger
    frames"): the switch's payload loops are walked by the verifier element
    by element (654 k instructions at k = 858, of the 1 M limit), and the
    way past that, a loop whose body is verified once (bpf_loop with a
    callback), is not open to a program compiled by this bcc: it leaves the
    callback's address 0 instead of relocating it. When this test fails,
    bcc can, and frames beyond a page (XDP multi-buffer) become possible."""
    src = tmp_path / "loop.c"
    src.write_text("#include <uapi/linux/bpf.h>\n"
                   "static long step(u32 i, void *sum) { *(u32 *)sum += i; return 0; }\n"
                   "int p(struct xdp_md *ctx) {\n"
                   "    u32 sum = 0;\n"
                   "    bpf_loop(10, step, &sum, 0);\n"
                   "    return sum == 45 ? XDP_PASS : XDP_DROP;\n"
                   "}\n")
    with pytest.raises(bpf.BpfError, match="cannot load p") as e:
        bpf.compile_program(src, "p")
    assert "expected=func" in e.value.log


@needs_lab
def test_missing_source_and_missing_function():
    with pytest.raises(bpf.BpfError, match="no BPF source"):
        bpf.compile_program("nope.c", "p")
    with pytest.raises(bpf.BpfError, match="cannot load nope"):
        bpf.compile_program(PASS, "nope")


@needs_lab
def test_maps_only_loads_nothing_and_several_threads_may_compile():
    progs, errors = [], []

    def build():
        try:
            progs.append(bpf.compile_program(PASS, "swml_pass", maps_only=True))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(progs) == 2
    with pytest.raises(bpf.BpfError, match="maps_only"):
        _ = progs[0].fd
    assert progs[0].load("swml_pass") > 0
    for p in progs:
        p.close()


# ------------------------------------------------------------ attaching

@needs_lab
def test_attach_query_detach_in_a_named_namespace(netns_pair, pass_prog):
    ns, a, _ = netns_pair
    assert bpf.attachment(a, netns=ns) == bpf.Attachment(None, 0)
    assert bpf.attach(a, pass_prog.fd, netns=ns) == "native"     # veth has native XDP
    att = bpf.attachment(a, netns=ns)
    assert att.mode == "native" and att.prog_id > 0
    with pytest.raises(bpf.XdpError):  # nobody's program is displaced by accident
        bpf.attach(a, pass_prog.fd, "native", netns=ns)
    assert bpf.attach(a, pass_prog.fd, "native", replace=True, netns=ns) == "native"
    assert bpf.detach(a, netns=ns, prog_id=att.prog_id + 1000) is False
    assert bpf.attachment(a, netns=ns) == att
    assert bpf.detach(a, netns=ns, prog_id=att.prog_id) is True
    assert bpf.attachment(a, netns=ns).mode is None
    assert bpf.detach(a, netns=ns) is False
    with pytest.raises(bpf.XdpError, match="no interface"):  # it is not in our namespace
        bpf.attachment(a)
    with pytest.raises(bpf.XdpError, match="no network namespace"):
        bpf.attach(a, pass_prog.fd, netns=f"{ns}-gone")


@needs_lab
def test_rtnetlink_reports_what_libbpf_does(netns_pair, pass_prog, monkeypatch):
    """net.link_xdp (IFLA_XDP) against libbpf's query, native and generic; and
    attachment() falls back to it where libbpf is missing (a GPU machine that
    runs the user-space switch)."""
    ns, a, b = netns_pair
    assert net.link_xdp(a, ns) == (0, 0)
    bpf.attach(a, pass_prog.fd, "native", netns=ns)
    bpf.attach(b, pass_prog.fd, "generic", netns=ns)
    native, generic = bpf.attachment(a, netns=ns), bpf.attachment(b, netns=ns)
    assert net.link_xdp(a, ns) == (1, native.prog_id) and net.link_xdp(b, ns) == (2, generic.prog_id)

    def no_libbpf():
        raise bpf.BpfError("libbpf is not installed (test)")
    monkeypatch.setattr(bpf.libbpf, "lib", no_libbpf)
    assert bpf.attachment(a, netns=ns) == native and bpf.attachment(b, netns=ns) == generic
    with pytest.raises(bpf.XdpError, match="no interface"):
        bpf.attachment(a)
    monkeypatch.undo()
    assert bpf.detach(a, netns=ns) and bpf.detach(b, netns=ns)
    assert net.link_xdp(a, ns) == (0, 0)


@needs_lab
def test_generic_on_request(netns_pair, pass_prog):
    ns, _, b = netns_pair
    assert bpf.attach(b, pass_prog.fd, "generic", netns=ns) == "generic"
    assert bpf.attachment(b, netns=ns).mode == "generic"
    assert bpf.detach(b, netns=ns)


@needs_lab
def test_native_falls_back_to_generic_saying_so(netns_pair, pass_prog, capfd):
    ns, _, _ = netns_pair
    assert bpf.attach("lo", pass_prog.fd, netns=ns) == "generic"   # loopback: no native XDP
    err = capfd.readouterr().err
    assert "native XDP unavailable on lo" in err and err.count("\n") == 1
    with pytest.raises(bpf.XdpError, match=r"cannot attach XDP \(native\) to lo"):
        bpf.attach("lo", pass_prog.fd, "native", replace=True, netns=ns)
    assert bpf.detach("lo", netns=ns)
    assert bpf.attach("lo", pass_prog.fd, quiet=True, netns=ns) == "generic"
    assert capfd.readouterr().err == ""
    bpf.detach("lo", netns=ns)


@needs_lab
def test_a_link_detaches_when_closed(netns_pair, pass_prog):
    ns, a, _ = netns_pair
    with bpf.attach_link(a, pass_prog.fd, netns=ns) as link:
        assert link.mode == "native" and bpf.attachment(a, netns=ns).mode == "native"
        with pytest.raises(bpf.XdpError):
            bpf.attach_link(a, pass_prog.fd, netns=ns)
    assert bpf.attachment(a, netns=ns).mode is None


@needs_lab
def test_net_lookups_in_a_namespace(netns_pair):
    ns, a, _ = netns_pair
    assert net.link_index(a, netns=ns) > 1
    assert net.link_ipv4(a, netns=ns) == "10.9.0.1"
    assert len(net.link_mac(a, netns=ns).split(":")) == 6
    with net.in_netns(ns):
        assert net.route_to("10.9.0.7") == ("10.9.0.1", a)


@needs_lab
def test_prog_stats_count_runs(netns_pair, pass_prog):
    ns, a, b = netns_pair
    bpf.attach(a, pass_prog.fd, netns=ns)
    prog_id = bpf.attachment(a, netns=ns).prog_id
    with bpf.stats_enabled():
        before = bpf.prog_stats(prog_id)
        with net.in_netns(ns), socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as s:
            s.bind((b, 0))
            for _ in range(3):  # out of b, into a's XDP hook
                s.send(b"\xff" * 6 + bytes(6) + b"\x88\xb5" + bytes(46))
        after = bpf.prog_stats(prog_id)
    assert after["run_cnt"] - before["run_cnt"] >= 3
    assert after["run_time_ns"] > before["run_time_ns"]
    with pytest.raises(bpf.BpfError, match="no BPF program"):
        bpf.prog_stats(2**31 - 1)


# ------------------------------------------------------------ test runs

@needs_lab
def test_test_run_returns_the_verdict_and_the_frame_as_the_program_left_it(tmp_path, pass_prog):
    frame = bytes(range(60))
    retval, out, ns = bpf.prog_test_run(pass_prog.fd, frame, repeat=100)
    assert (retval, out) == (2, frame) and ns >= 0  # XDP_PASS, untouched
    src = tmp_path / "tx.c"  # grows the frame by 4 bytes, marks its first byte, sends it back
    src.write_text("#include <uapi/linux/bpf.h>\n"
                   "int tx(struct xdp_md *ctx) {\n"
                   "  if (bpf_xdp_adjust_tail(ctx, 4)) return XDP_ABORTED;\n"
                   "  unsigned char *p = (void *)(long)ctx->data;\n"
                   "  if ((void *)(p + 1) > (void *)(long)ctx->data_end) return XDP_ABORTED;\n"
                   "  p[0] = 0xab; return XDP_TX; }\n")
    with bpf.compile_program(src, "tx") as prog:
        retval, out, _ = bpf.prog_test_run(prog.fd, frame)
    assert retval == 3 and len(out) == len(frame) + 4  # XDP_TX
    assert out[0] == 0xAB and out[1:len(frame)] == frame[1:]


@needs_lab
def test_test_run_refusals_are_one_line(pass_prog):
    with pytest.raises(bpf.BpfError, match="cannot test-run .* 13 bytes: Invalid argument"):
        bpf.prog_test_run(pass_prog.fd, bytes(13))  # shorter than an Ethernet header
    with pytest.raises(bpf.BpfError, match="Bad file descriptor"):
        bpf.prog_test_run(9999, bytes(60))


# ------------------------------------------------------------ pins

@needs_lab
def test_pinned_maps_outlive_their_program():
    bpf.ensure_bpffs()
    d = f"{bpf.PIN_ROOT}/test-door-{secrets.token_hex(3)}"
    os.makedirs(d)
    try:
        defines = {"SWML_K": 64, "SWML_SLOTS": 8, "SWML_PIN_DIR": bpf.c_string(d),
                   **address_defines("10.0.0.1", "02:00:00:00:00:01")}
        with bpf.compile_program("swml_switch.c", "swml_switch", defines):
            pass
        assert sorted(os.listdir(d)) == ["counters", "job_left", "job_pace", "job_stats", "jobs",
                                          "members", "parent_routes", "port_stats", "slots"]
        Member = layout.ctype("swml_member")
        with bpf.PinnedMap(f"{d}/members", Member) as m:
            m.update(3, Member(ip=0x1234, port=7))
            assert (m.lookup(3).ip, m.lookup(3).port) == (0x1234, 7)
            with pytest.raises(bpf.PinnedMapError) as e:
                m.lookup(10**6)
            assert e.value.errno == errno.ENOENT
        with bpf.PinnedMap(f"{d}/counters", ct.c_uint64, percpu=True) as c:
            assert all(v.value == 0 for v in c.lookup(0))
            with pytest.raises(bpf.PinnedMapError, match="per-CPU"):
                c.update(0, ct.c_uint64(1))
        with bpf.PinnedMap(f"{d}/job_stats", ct.c_uint64 * 4, percpu=True) as js:
            js.zero(5)   # a per-CPU row is reset whole, on every CPU
            assert all(list(v) == [0, 0, 0, 0] for v in js.lookup(5))
    finally:
        assert bpf.remove_pins(d) is True
    assert not os.path.exists(d)
    with pytest.raises(bpf.PinnedMapError) as e:
        bpf.PinnedMap(f"{d}/jobs", ct.c_uint64)
    assert e.value.errno == errno.ENOENT and "cannot open pinned map" in str(e.value)


# ------------------------------------------------------------ the shared C
