"""The metrics endpoint's HTTP server (switch/metrics_http.py,
switch/metrics_request.py) on the loopback: request parsing, the read
timeout, the per-address and total caps, slow readers, and one-line logs."""
from __future__ import annotations

import asyncio
import logging
import socket
from http import HTTPStatus

import pytest

from switchml_xdp.switch import descriptors
from switchml_xdp.switch.metrics_http import HttpEndpoint
from switchml_xdp.switch.metrics_request import MAX_HEAD, HttpError, Request, check_request, parse_head
from switchml_xdp.switch.quiet_log import QuietLog

BODY = b"# HELP x y\nx 1.0\n"


# --- parsing -----------------------------------------------------------------------

@pytest.mark.parametrize("head, want", [
    (b"GET /metrics HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", Request("GET", "/metrics", "HTTP/1.1")),
    (b"HEAD /metrics?x=1 HTTP/1.0\n\n", Request("HEAD", "/metrics", "HTTP/1.0")),
])
def test_a_request_head_is_parsed(head, want):
    assert parse_head(head) == want


@pytest.mark.parametrize("head, why", [
    (b"GET /metrics\r\n\r\n", "malformed request line"),
    (b"GET  /metrics HTTP/1.1\r\n\r\n", "malformed request line"),
    (b"GET /metrics HTTP/2.0\r\n\r\n", "unsupported protocol"),
    (b"get /metrics HTTP/1.1\r\n\r\n", "malformed method"),
    (b"GET metrics HTTP/1.1\r\n\r\n", "malformed request target"),
    (b"GET /m\x1b[2J HTTP/1.1\r\n\r\n", "malformed request target"),
    (b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n", "malformed header line"),
    (b"GET /metrics HTTP/1.1\r\n folded: x\r\n\r\n", "malformed header line"),
    (b"GET /metrics HTTP/1.1\r\nX: \xff\r\n\r\n", "not ASCII"),
])
def test_a_malformed_head_is_a_400_with_one_line(head, why):
    with pytest.raises(HttpError, match=why) as e:
        parse_head(head)
    assert e.value.status == HTTPStatus.BAD_REQUEST and "\n" not in e.value.reason


def test_only_get_and_head_of_the_path():
    check_request(Request("GET", "/metrics", "HTTP/1.1"), "/metrics")
    for req, status in ((Request("POST", "/metrics", "HTTP/1.1"), HTTPStatus.METHOD_NOT_ALLOWED),
                        (Request("GET", "/", "HTTP/1.1"), HTTPStatus.NOT_FOUND)):
        with pytest.raises(HttpError) as e:
            check_request(req, "/metrics")
        assert e.value.status == status


def test_quiet_log_says_once_an_interval_how_many_it_left_out(caplog):
    now = [0.0]
    q = QuietLog(logging.getLogger("t"), 10.0, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert q.warning("k", "trouble %d", 1)
        assert not any(q.warning("k", "trouble %d", 2) for _ in range(5))
        assert q.warning("other", "else")
        now[0] = 10.0
        assert q.warning("k", "trouble %d", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "trouble 1", "else", "trouble 3 (5 more like it since the last such line)"]


# --- the server on the loopback ----------------------------------------------------

def run(scenario, **kw):
    """scenario(endpoint, port) on a fresh loop, with an endpoint on 127.0.0.1."""
    async def main():
        ep = HttpEndpoint(lambda: BODY, "text/plain; version=0.0.4", **kw)
        await ep.start("127.0.0.1", 0)
        try:
            return await scenario(ep, ep.port)
        finally:
            await ep.close()
    return asyncio.run(main())


async def fetch(port: int, request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(request)
    data = await asyncio.wait_for(r.read(), 5)
    w.close()
    return data


async def half_open(port: int, n: int, partial: bytes = b"GET /metr"):
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(n)]
    for _, w in conns:
        w.write(partial)
    return conns


async def until(cond, what: str, within_s: float = 2.0) -> None:
    for _ in range(int(within_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not {what} after {within_s} s")


async def until_idle(ep, within_s: float = 2.0) -> None:
    await until(lambda: ep.connections == 0, "idle", within_s)


def status_of(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1]) if reply else 0


def test_a_scrape_gets_the_text_and_a_bad_request_its_status():
    async def scenario(ep, port):
        ok = await fetch(port)
        assert status_of(ok) == 200 and ok.endswith(b"\r\n\r\n" + BODY)
        assert b"Content-Type: text/plain; version=0.0.4" in ok and b"Connection: close" in ok
        head = await fetch(port, b"HEAD /metrics HTTP/1.0\r\n\r\n")
        assert status_of(head) == 200 and head.endswith(b"\r\n\r\n")
        assert status_of(await fetch(port, b"GET / HTTP/1.1\r\n\r\n")) == 404
        assert status_of(await fetch(port, b"DELETE /metrics HTTP/1.1\r\n\r\n")) == 405
        assert status_of(await fetch(port, b"\x00\x01junk\r\n\r\n")) == 400
        big = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_HEAD + b"\r\n\r\n"
        assert status_of(await fetch(port, big)) == 431
        await until_idle(ep)
    run(scenario)


def test_a_render_that_fails_is_a_500_and_one_line(caplog):
    async def scenario(ep, port):
        ep.render = lambda: 1 / 0
        reply = await fetch(port)
        assert status_of(reply) == 500 and b"Traceback" not in reply
    with caplog.at_level(logging.WARNING):
        run(scenario)
    assert any("cannot render the scrape: ZeroDivisionError" in r.getMessage() for r in caplog.records)
    assert not any(r.exc_info for r in caplog.records)


def test_half_open_clients_get_408_after_the_read_timeout():
    async def scenario(ep, port):
        (r, w), = await half_open(port, 1)
        reply = await asyncio.wait_for(r.read(), 5)
        w.close()
        assert status_of(reply) == 408
    run(scenario, request_timeout_s=0.3)


def test_one_address_gets_its_cap_and_the_rest_are_refused_at_once(caplog):
    async def scenario(ep, port):
        held = await half_open(port, 4)
        await until(lambda: ep.connections == 4, "4 accepted")
        extra = await half_open(port, 20)
        replies = [await asyncio.wait_for(r.read(), 2) for r, _ in extra]
        assert {status_of(x) for x in replies} <= {503, 0}   # 0: reset before it was read
        assert any(b"too many connections from 127.0.0.1 (limit 4)" in x for x in replies)
        await asyncio.sleep(0.1)
        assert ep.connections == 4
        for _, w in held + extra:
            w.close()
    with caplog.at_level(logging.WARNING):
        run(scenario, per_ip=4, request_timeout_s=30)
    refusals = [r for r in caplog.records if "too many connections" in r.getMessage()]
    assert len(refusals) == 1, "one line per interval, not one per connection"


def test_at_the_total_cap_new_connections_wait_in_the_backlog(monkeypatch):
    async def scenario(ep, port):
        held = await half_open(port, 3)   # the per-address cap is lifted here
        await until(lambda: ep.connections == 3, "3 accepted")
        waiting = asyncio.create_task(fetch(port))
        await asyncio.sleep(0.3)
        assert not waiting.done() and ep.connections == 3
        held[0][1].close()
        assert status_of(await asyncio.wait_for(waiting, 5)) == 200
        for _, w in held[1:]:
            w.close()
    run(scenario, per_ip=100, total=3, request_timeout_s=30)


def test_the_budget_shrinks_where_few_descriptors_are_left(monkeypatch):
    import os
    import resource

    used = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(resource, "getrlimit", lambda which: (used + 40, used + 40))
    assert descriptors.share_of_free_descriptors(32) == 10
    monkeypatch.setattr(resource, "getrlimit", lambda which: (used + 1, used + 1))
    assert descriptors.share_of_free_descriptors(32) == 1


def test_a_client_that_does_not_read_its_response_is_dropped(caplog):
    big = b"x" * (64 << 20)   # more than the loopback's socket buffers hold

    async def scenario(ep, port):
        ep.render = lambda: big
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
        try:
            await until(lambda: ep.connections == 1, "accepted")
            await until_idle(ep, 4.0)
        finally:
            sock.close()
    with caplog.at_level(logging.WARNING):
        run(scenario, request_timeout_s=0.5)
    assert any("did not take its response" in r.getMessage() for r in caplog.records)
