"""While a rank waits at the switch's barrier, say which ranks it waits for.

The join itself blocks until every rank has joined, and nothing may be sent
on a joining connection; so a thread asks the switch's `status` (any
connection may, no token) on a connection of its own, about once a second,
and prints a line whenever the set of missing ranks changes.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

POLL_S = 1.0


def missing_ranks(status: dict, job: str, world: int) -> list[int] | None:
    """Ranks of `job` not joined yet, per a `status` reply; None if the job is
    not waiting at its barrier (not there yet, or running)."""
    for j in status.get("jobs", []):
        if j["name"] == job and j["state"] == "joining":
            joined = {int(r) for r in j["members"]}
            return [r for r in range(world) if r not in joined]
    return None


def _ranks(ranks: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, ranks[:most]))
    return shown + (f" and {len(ranks) - most} more" if len(ranks) > most else "")


@contextlib.contextmanager
def report(switch: str, control_port: int, job: str, rank: int, world: int,
           say: Callable[[str], None]) -> Iterator[None]:
    """Print "waiting for ranks ..." lines with `say` until the block ends."""
    stop = threading.Event()

    def watch() -> None:
        from ..client.control import ControlClient, ControlError

        if stop.wait(POLL_S):
            return
        try:
            client = ControlClient(switch, control_port, connect_timeout=2.0)
        except ControlError:
            return
        last = None
        try:
            while not stop.is_set():
                missing = missing_ranks(client.status(), job, world)
                if missing and missing != last and not stop.is_set():
                    say(f"swml-worker: rank {rank}: job {job!r}: {world - len(missing)}/{world} ranks "
                        f"joined; waiting for rank{'s' if len(missing) > 1 else ''} {_ranks(missing)}")
                    last = missing
                if stop.wait(POLL_S):
                    break
        except (ControlError, OSError, ValueError):
            pass   # only a progress report: the join says what went wrong
        finally:
            client.close()

    t = threading.Thread(target=watch, name="swml-join-progress", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
