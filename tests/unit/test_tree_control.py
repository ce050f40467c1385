"""The tree's control path (switch/uplink.py) in one event loop: a parent box
and a rack box on the loopback over in-memory maps, two workers behind the
rack box (ranks 0 and 2) and one on the parent directly (rank 1). What the
rack box writes for the data plane (the job's ranks, its uplink, the parent
route), leave and abort across the levels, and the parent's refusals told
to the rack's workers. The parent's own rules: test_tree_parent.py."""
from __future__ import annotations

import asyncio
import time

import pytest

from switchml_xdp import wire
from tree_servers import DATA_PORT, HOST, PARENT_MAC, UPLINK, Tree, join


def in_tree(body) -> None:
    """Run `body(tree)` against a fresh parent and rack box, stopped after."""
    async def scenario():
        tree = await Tree().start()
        try:
            await body(tree)
        finally:
            await tree.stop()
    asyncio.run(asyncio.wait_for(scenario(), 60))


async def three_ranks(tree: Tree, job: str):
    """Ranks 0 and 2 at the rack box, 1 at the parent, all at once."""
    return await asyncio.gather(join(tree.rack_port, "127.0.0.11", job, 3, 0),
                                join(tree.parent_port, "127.0.0.13", job, 3, 1),
                                join(tree.rack_port, "127.0.0.12", job, 3, 2))


def test_lanes_below_a_rack_box_are_the_whole_job_s_and_its_uplink_streams_one():
    """Ranks behind a rack box stream in lanes to it (docs/performance.md,
    "Several queues per worker"); the rack box's joins carry them to the
    parent, which agrees on them for the whole job and takes a window that
    is a multiple of them, while its data plane takes the uplink's DATA
    from one port."""
    async def body(tree):
        (w0, r0), (w1, r1) = await asyncio.gather(
            join(tree.rack_port, "127.0.0.11", "j", 2, 0, lanes=2),
            join(tree.rack_port, "127.0.0.12", "j", 2, 1, lanes=2))
        assert r0["ok"] and r1["ok"], (r0, r1)
        assert r0["lanes"] == r1["lanes"] == 2 and r0["slots"] % 2 == 0
        assert tree.rack_maps.entries[r0["job_id"]].lanes == 2
        top = tree.parent.table.jobs["j"]
        assert top.lanes == 2 and top.slot_count == r0["slots"]
        assert tree.parent_maps.entries[top.id].lanes == 1     # the uplink: one lane
        for w in (w0, w1):
            w.close()

    in_tree(body)


def test_a_job_with_lanes_is_not_both_behind_rack_boxes_and_direct():
    async def body(tree):
        behind = [asyncio.create_task(join(tree.rack_port, f"127.0.0.1{r}", "j", 3, r, lanes=2))
                  for r in (0, 2)]
        for _ in range(250):     # the rack box's joins reach the parent first
            job = tree.parent.table.jobs.get("j")
            if job and len(job.members) == 2:
                break
            await asyncio.sleep(0.02)
        w1, r1 = await join(tree.parent_port, "127.0.0.13", "j", 3, 1, lanes=2)
        assert not r1["ok"] and "all through rack boxes or all directly" in r1["error"], r1
        w1.close()
        for task in behind:
            task.cancel()

    in_tree(body)


def test_the_rack_box_starts_its_job_as_the_parent_says():
    async def body(tree):
        (w0, r0), (w1, r1), (w2, r2) = await three_ranks(tree, "j")
        assert r0["ok"] and r1["ok"] and r2["ok"], (r0, r1, r2)
        # The workers see their rack box's job, with the whole world.
        assert r0["world"] == r2["world"] == 3 and (r0["rank"], r2["rank"]) == (0, 2)
        assert r0["job_id"] == r2["job_id"] and r0["key"] == r2["key"]
        assert r0["switch"]["ip"] == HOST and r0["switch"]["port"] == DATA_PORT
        # ... the parent's window and first seq, its own keys.
        assert r0["slots"] == r1["slots"] and r0["seq_base"] == r1["seq_base"]
        assert r0["key"] != r1["key"] and r0["result_key"] != r1["result_key"]
        local = tree.rack_maps.entries[r0["job_id"]]
        assert local.world == 2 and local.rank_mask == 0b101
        assert local.slot_count == r1["slots"]
        up = local.uplink
        assert (up.job_id, up.rank, up.key, up.result_key.hex()) == \
            (r1["job_id"], 0, int(r1["key"], 16), r1["result_key"])
        assert (up.parent_ip, up.parent_port, up.parent_mac) == (HOST, DATA_PORT + 1, PARENT_MAC)
        assert (up.src_ip, up.src_port, up.src_mac, up.ifindex) == \
            (UPLINK.ip, DATA_PORT, UPLINK.mac, UPLINK.ifindex)
        assert up.auth == wire.AUTH_MODES[r1["auth"]]
        assert tree.rack_maps.routes == {(HOST, r1["job_id"]): r0["job_id"]}
        # The parent: the rack box is one member, at rank 0; rank 1 direct.
        top = tree.parent_maps.entries[r1["job_id"]]
        assert top.world == 2 and top.rank_mask == 0b11
        assert tree.parent_maps.member_rows[r1["job_id"]] == \
            {0: (UPLINK.ip, DATA_PORT), 1: ("127.0.0.13", DATA_PORT)}
        shown = tree.link.describe()
        assert shown["parent"] == HOST and shown["uplink"] == "lo"
        assert shown["jobs"] == {"j": {"parent_job": r1["job_id"], "rank": 0, "ranks": [0, 2]}}
        children = tree.parent.status_reply()["jobs"][0]["children"]
        assert children == [{"box": f"{UPLINK.ip}:{DATA_PORT}", "rank": 0, "ranks": [0, 2]}]

        # Leaves go up, rank by rank; the last one ends the job at both levels.
        assert (await w0.request({"op": "leave", "token": "tok"}))["job_ended"] is False
        assert (await w2.request({"op": "leave", "token": "tok"}))["job_ended"] is True
        assert not tree.rack_maps.routes and r0["job_id"] not in tree.rack_maps.entries
        for _ in range(50):
            members = tree.parent.table.jobs["j"].members
            if members[0].left and members[2].left:
                break
            await asyncio.sleep(0.02)
        assert members[0].left and members[2].left and not members[1].left
        assert (await w1.request({"op": "leave", "token": "tok"}))["job_ended"] is True
        assert not tree.parent.table.jobs and not tree.link.jobs
    in_tree(body)


@pytest.mark.parametrize("how", ["stopped", "killed"])
def test_the_parent_lost_aborts_the_racks_workers_naming_it(how):
    async def body(tree):
        (w0, r0), (w1, _), (w2, _) = await three_ranks(tree, "j")
        assert r0["ok"]
        t0 = time.monotonic()
        if how == "stopped":
            await tree.parent.stop("the switch is shutting down")
            words = f"the parent box {HOST} aborted the job: the switch is shutting down"
        else:   # the daemon dies: its connections close, no word
            for c in list(tree.parent._conns):
                c.writer.transport.abort()
            words = f"lost the parent box {HOST} (its control connection closed)"
        for w in (w0, w2):
            event = await w.recv(2.0)
            assert event["event"] == "abort" and event["reason"] == words, event
        assert time.monotonic() - t0 < 2.0
        assert not tree.rack.table.jobs and not tree.rack_maps.routes and not tree.link.jobs
    in_tree(body)


def test_a_rack_worker_lost_aborts_the_whole_job():
    async def body(tree):
        (w0, r0), (w1, _), (w2, _) = await three_ranks(tree, "j")
        assert r0["ok"]
        w0.close()
        event = await w2.recv(2.0)
        assert event["event"] == "abort" and "rank 0" in event["reason"], event
        # The rack box closed its connections up: the parent aborts the job too.
        event = await w1.recv(2.0)
        assert event["event"] == "abort" and event["reason"].startswith(
            f"the rack box {UPLINK.ip} (rank "), event
    in_tree(body)


def test_the_parents_refusal_reaches_the_rack_worker_named():
    async def body(tree):
        # The direct rank opens the job at the parent with another token.
        direct = asyncio.create_task(join(tree.parent_port, "127.0.0.13", "j", 2, 1,
                                          token="other", timeout=3))
        await asyncio.sleep(0.2)
        w0, r0 = await join(tree.rack_port, "127.0.0.11", "j", 2, 0)
        assert r0 == {"op": "join", "ok": False,
                      "error": f"parent box {HOST}: wrong token for job 'j'"}
        assert not tree.rack.table.jobs and not tree.link.jobs   # no trace left
        _, r1 = await direct
        assert not r1["ok"] and "timed out" in r1["error"]
    in_tree(body)


def test_a_parent_timeout_is_the_rack_workers_error():
    async def body(tree):
        _, r0 = await join(tree.rack_port, "127.0.0.11", "j", 3, 0, timeout=0.5)
        assert not r0["ok"]
        assert r0["error"].startswith(f"parent box {HOST}: timed out after 0.5 s waiting "
                                      f"for rank(s) 1, 2 of job 'j'"), r0
        assert not tree.parent.table.jobs and not tree.rack.table.jobs
    in_tree(body)


def test_an_unreachable_parent_is_the_rack_workers_error():
    async def body(tree):
        await tree.parent.stop("gone")
        _, r0 = await join(tree.rack_port, "127.0.0.11", "j", 2, 0, timeout=1)
        assert not r0["ok"] and r0["error"].startswith(
            f"parent box {HOST}: cannot reach its control port"), r0
    in_tree(body)
