"""Beyond NSQ: GET /metrics, the broker's counters in Prometheus' text exposition format (``prometheus_client``).

Everything comes from one /stats snapshot (not fresh: at most the workers' 100 ms publication period old, so a
scrape costs the broker nothing) plus what the supervisor's shared words say (restarts, full topics) and each
process's /proc entry (CPU, RSS). Built per scrape by a collector, so no metric object outlives its topic.
"""
from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["broker_metrics", "exposition", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")

_TOPIC = (("depth", "depth", "Messages waiting for the topic's first channel", GaugeMetricFamily),
          ("backend_depth", "backend_depth", "Part of the depth held on disk", GaugeMetricFamily),
          ("messages", "message_count", "Messages published to the topic", CounterMetricFamily),
          ("message_bytes", "message_bytes", "Bytes of message bodies published to the topic", CounterMetricFamily),
          ("paused", "paused", "1 while the topic is paused", GaugeMetricFamily))
_CHANNEL = (("depth", "depth", "Messages waiting in the channel", GaugeMetricFamily),
            ("backend_depth", "backend_depth", "Part of the depth held on disk", GaugeMetricFamily),
            ("in_flight", "in_flight_count", "Messages delivered and not yet finished", GaugeMetricFamily),
            ("deferred", "deferred_count", "Deferred messages", GaugeMetricFamily),
            ("messages", "message_count", "Messages put into the channel (requeues not counted again)",
             CounterMetricFamily),
            ("requeues", "requeue_count", "Messages requeued", CounterMetricFamily),
            ("timeouts", "timeout_count", "Messages that timed out in flight", CounterMetricFamily),
            ("clients", "client_count", "Consumers connected", GaugeMetricFamily),
            ("paused", "paused", "1 while the channel is paused", GaugeMetricFamily))


def _proc(pid: int):
    """(CPU seconds, resident bytes) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS, int(fields[21]) * _PAGE


# nsqpy's policies (workers/domain/policy.py): only channels that have one (or counted a drop) have these
_POLICY_COUNTS = (("dead_lettered", "dead_lettered_count", "Messages moved to the dead-letter topic (max attempts "
                   "or TTL)"),
                  ("expired", "expired_count", "Messages dropped for their TTL (no dead-letter topic)"),
                  ("dropped", "dropped_count", "Oldest messages dropped by a full channel (overflow drop_oldest)"))
_POLICY_VALUES = (("max_attempts", "max_attempts", "The channel's effective max attempts (0: off)"),
                  ("message_ttl_seconds", "message_ttl_ms", "The channel's effective message TTL (0: off)"),
                  ("max_depth", "max_depth", "The channel's effective max depth (0: no bound)"),
                  ("max_bytes", "max_bytes", "The channel's effective max bytes (0: no bound)"))


def _policies(topics):
    with_policy = [(t["topic_name"], c) for t in topics for c in t["channels"] if "dropped_count" in c]
    for suffix, key, doc in _POLICY_COUNTS:
        fam = CounterMetricFamily(f"nsqpy_channel_{suffix}", doc, labels=["topic", "channel"])
        for topic, c in with_policy:
            fam.add_metric([topic, c["channel_name"]], c[key])
        yield fam
    for suffix, key, doc in _POLICY_VALUES:
        fam = GaugeMetricFamily(f"nsqpy_channel_policy_{suffix}", doc, labels=["topic", "channel"])
        for topic, c in with_policy:
            p = c.get("policy")
            if p:
                fam.add_metric([topic, c["channel_name"]], p[key] / 1000 if key == "message_ttl_ms" else p[key])
        yield fam
    info = GaugeMetricFamily("nsqpy_channel_policy_info", "1 per channel with a policy: its dead-letter topic and "
                             "overflow", labels=["topic", "channel", "dead_letter_topic", "overflow"])
    for topic, c in with_policy:
        p = c.get("policy")
        if p:
            info.add_metric([topic, c["channel_name"], p["dead_letter_topic"], p["overflow"]], 1)
    yield info


def _percentiles(d):
    return (d.get("e2e_processing_latency") or {}).get("percentiles") or ()


class _Collector:
    def __init__(self, stats: dict, extras: dict):
        self.stats = stats
        self.extras = extras

    def collect(self):
        topics = self.stats.get("topics") or []
        for suffix, key, doc, kind in _TOPIC:
            fam = kind(f"nsq_topic_{suffix}", doc, labels=["topic"])
            for t in topics:
                fam.add_metric([t["topic_name"]], int(t[key]))
            yield fam
        for suffix, key, doc, kind in _CHANNEL:
            fam = kind(f"nsq_channel_{suffix}", doc, labels=["topic", "channel"])
            for t in topics:
                for c in t["channels"]:
                    fam.add_metric([t["topic_name"], c["channel_name"]], int(c[key]))
            yield fam
        yield from _policies(topics)
        # --e2e-processing-latency-percentile: nsqd's statsd gauges e2e_processing_latency_<pct>, as a quantile label
        e2e = GaugeMetricFamily("nsq_topic_e2e_processing_latency_seconds",
                                "End-to-end latency percentiles of the topic's channels merged",
                                labels=["topic", "quantile"])
        for t in topics:
            for item in _percentiles(t):
                e2e.add_metric([t["topic_name"], str(float(item["quantile"]))], item["value"] / 1e9)
        yield e2e
        e2e = GaugeMetricFamily("nsq_channel_e2e_processing_latency_seconds",
                                "End-to-end latency percentiles (publication to FIN)",
                                labels=["topic", "channel", "quantile"])
        for t in topics:
            for c in t["channels"]:
                for item in _percentiles(c):
                    e2e.add_metric([t["topic_name"], c["channel_name"], str(float(item["quantile"]))],
                                   item["value"] / 1e9)
        yield e2e
        e2e = GaugeMetricFamily("nsq_channel_e2e_processing_latency_count",
                                "FINs the channel's end-to-end latency percentiles cover", labels=["topic", "channel"])
        for t in topics:
            for c in t["channels"]:
                if _percentiles(c):
                    e2e.add_metric([t["topic_name"], c["channel_name"]], c["e2e_processing_latency"]["count"])
        yield e2e
        yield from self._processes()

    def _processes(self):
        cpu = CounterMetricFamily("nsqpy_process_cpu_seconds", "CPU time of each broker process",
                                  labels=["process"])
        rss = GaugeMetricFamily("nsqpy_process_resident_memory_bytes", "Resident memory of each broker process",
                                labels=["process"])
        for name, pid in self.extras.get("processes", {}).items():
            got = _proc(pid)
            if got is not None:
                cpu.add_metric([name], got[0])
                rss.add_metric([name], got[1])
        yield cpu
        yield rss
        restarts = CounterMetricFamily("nsqpy_process_restarts", "Restarts of each supervised process after a crash",
                                       labels=["process"])
        for name, n in self.extras.get("restarts", {}).items():
            restarts.add_metric([name], n)
        yield restarts
        full = GaugeMetricFamily("nsqpy_topics_full", "Topics whose owner refuses publishes (no room to store)",
                                 labels=["worker"])
        held = GaugeMetricFamily("nsqpy_channels_held_by_full_table",
                                 "Channels waiting for in-flight table slots", labels=["worker"])
        inflight = GaugeMetricFamily("nsqpy_in_flight_table_used", "In-flight table slots in use", labels=["worker"])
        for w, n in enumerate(self.extras.get("topics_full", ())):
            full.add_metric([str(w)], n)
        for w, info in enumerate((self.stats.get("memory") or {}).get("nsqpy_workers", ())):
            held.add_metric([str(w)], info["channels_held_by_full_table"])
            inflight.add_metric([str(w)], info["in_flight"])
        yield full
        yield held
        yield inflight


def exposition(stats: dict, extras: dict) -> bytes:
    """The text exposition of a /stats dict (with ``memory``) and the process extras."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(stats, extras))
    return generate_latest(registry)


def broker_metrics(reader, extras_fn) -> bytes:
    return exposition(reader.stats(include_clients=False, fresh=False), extras_fn())
