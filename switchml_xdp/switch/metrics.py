"""`swml-switch up --metrics [ADDR:]PORT`: the switch's counters for Prometheus.

Every scrape reads the data plane afresh (nothing is cached): packets by
outcome, drops by reason, per-job packets, bytes, results and shadow replies
(where the data plane counts per job), jobs by state, members per job, slots
in use, and under `up --share` each job's part, weight and rates. The HTTP
server (metrics_http.py) runs on the daemon's event loop, where the job
table lives, under the control port's limits; a scrape never sees a
half-changed table, and prometheus-client only renders the text.
Documented, with an example scrape, in docs/operations.md.
"""
from __future__ import annotations

from collections.abc import Callable

from .. import wire
from .metrics_http import HttpEndpoint

#: Per-job cumulative counters (DataplaneMaps.read_job_stats) -> metric name and help.
JOB_COUNTERS = {
    "packets": ("swml_job_packets", "DATA packets of the job taken in by the switch"),
    "bytes": ("swml_job_bytes", "bytes of the job's DATA packets taken in by the switch"),
    "results": ("swml_job_results", "RESULT packets of the job (slot rounds completed)"),
    "shadow_replies": ("swml_job_shadow_replies",
                       "stored results sent again to answer the job's retransmissions"),
}

#: A running job's part under `up --share` (Shares.describe) -> gauge name and help.
JOB_SHARE_GAUGES = {
    "share": ("swml_job_share", "the job's part of the box's capacity under --share (0..1)"),
    "weight": ("swml_job_weight", "the job's weight (asked at join or set by the operator)"),
    "target_bps": ("swml_job_target_bits_per_second",
                   "the rate the box tells the job's ranks, all together (Ethernet frames)"),
    "actual_bps": ("swml_job_actual_bits_per_second",
                   "the rate of the job's DATA into the box, averaged over about 0.25 s"),
    "remaining_bytes": ("swml_job_remaining_bytes",
                        "bytes of the ranks' current calls left to send to the box (0: not said)"),
}


class MetricsError(RuntimeError):
    """Why the metrics endpoint cannot serve, in one line."""


def parse_listen(text: str) -> tuple[str, int]:
    """"9100" -> ("0.0.0.0", 9100); "127.0.0.1:9100" -> ("127.0.0.1", 9100)."""
    addr, _, port = str(text).rpartition(":")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: give a TCP port (1..65535), or ADDRESS:PORT")
    return addr or "0.0.0.0", int(port)


class SwitchCollector:
    """A prometheus-client collector over one switch's status snapshot: the
    control protocol's `status` reply (jobs, slots, counters, job_stats)."""

    def __init__(self, snapshot: Callable[[], dict], iface: str):
        self.snapshot, self.iface = snapshot, iface

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snap = self.snapshot()
        counters = snap.get("counters") or {}
        packets = CounterMetricFamily("swml_packets", "packets the switch handled, by outcome",
                                      labels=["iface", "outcome"])
        drops = CounterMetricFamily("swml_dropped_packets", "packets the switch dropped, by reason",
                                    labels=["iface", "reason"])
        for name in wire.COUNTER_NAMES:
            family = drops if name in wire.DROP_REASONS else packets
            family.add_metric([self.iface, name], counters.get(name, 0))
        yield packets
        yield drops

        jobs = snap.get("jobs", [])
        names = {str(j["id"]): j["name"] for j in jobs if j["id"] is not None}
        job_stats = snap.get("job_stats") or {}
        for key, (metric, text) in JOB_COUNTERS.items():
            family = CounterMetricFamily(metric, text, labels=["iface", "job", "job_id"])
            for job_id, stats in sorted(job_stats.items(), key=lambda kv: int(kv[0])):
                if job_id in names:   # counters of ids no job holds now are history
                    family.add_metric([self.iface, names[job_id], job_id], stats.get(key, 0))
            yield family

        by_state = GaugeMetricFamily("swml_jobs", "jobs on the switch, by state",
                                     labels=["iface", "state"])
        for state in ("joining", "running"):
            by_state.add_metric([self.iface, state], sum(j["state"] == state for j in jobs))
        yield by_state
        members = GaugeMetricFamily("swml_job_members", "ranks that have joined the job",
                                    labels=["iface", "job", "job_id"])
        world = GaugeMetricFamily("swml_job_world", "ranks the job has (its world size)",
                                  labels=["iface", "job", "job_id"])
        for j in jobs:
            labels = [self.iface, j["name"], str(j["id"] or "")]
            members.add_metric(labels, sum(not m["left"] for m in j["members"].values()))
            world.add_metric(labels, j["world"])
        yield members
        yield world
        group = GaugeMetricFamily("swml_job_group_info", "the multicast group of the job's RESULTs "
                                  "(1; running jobs)", labels=["iface", "job", "job_id", "group"])
        for j in jobs:
            if (j.get("group") or {}).get("ip"):
                group.add_metric([self.iface, j["name"], str(j["id"]), j["group"]["ip"]], 1)
        yield group
        yield from self._shares(snap, jobs)
        total = snap.get("slots_total", 0)
        yield _gauge("swml_slots_in_use", "aggregation slots held by jobs", self.iface,
                     total - snap.get("slots_free", total))
        yield _gauge("swml_slots", "aggregation slots of the switch", self.iface, total)

    def _shares(self, snap: dict, jobs: list[dict]):
        """Under `up --share`: the box's capacity under its policy, and each
        running job's part, weight, target and actual rates, what its ranks
        said they have left (docs/operations.md, "Shares between jobs")."""
        from prometheus_client.core import GaugeMetricFamily

        info = snap.get("shares")
        if not info:
            return
        capacity = GaugeMetricFamily("swml_share_capacity_bits_per_second",
                                     "the box's capacity that --share divides between jobs",
                                     labels=["iface", "policy"])
        capacity.add_metric([self.iface, str(info["policy"])], info["capacity_bps"])
        yield capacity
        shared = [j for j in jobs if j.get("share")]
        for key, (metric, text) in JOB_SHARE_GAUGES.items():
            family = GaugeMetricFamily(metric, text, labels=["iface", "job", "job_id"])
            for j in shared:
                family.add_metric([self.iface, j["name"], str(j["id"])], j["share"][key])
            yield family


def _gauge(name: str, text: str, iface: str, value: float):
    from prometheus_client.core import GaugeMetricFamily

    g = GaugeMetricFamily(name, text, labels=["iface"])
    g.add_metric([iface], value)
    return g


class MetricsServer:
    """The endpoint (metrics_http.py, on the daemon's event loop) over one
    collector, rendered by prometheus-client in its text format."""

    def __init__(self, collector: SwitchCollector):
        try:
            from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
        except ImportError:
            raise MetricsError("--metrics needs prometheus-client (pip install prometheus-client; "
                               "scripts/setup.sh installs it)") from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        self.endpoint = HttpEndpoint(lambda: generate_latest(registry), CONTENT_TYPE_LATEST)

    async def start(self, addr: str, port: int) -> None:
        try:
            await self.endpoint.start(addr, port)
        except OSError as e:
            raise MetricsError(f"cannot serve metrics on {addr}:{port}: {e.strerror or e}") from None
        self.addr, self.port = addr, port

    async def close(self) -> None:
        await self.endpoint.close()
