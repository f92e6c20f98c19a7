"""Beyond Go's nsqadmin: GET /metrics, the cluster's per-topic and per-channel totals (summed over every nsqd that
answered) in Prometheus' text exposition format, so one scrape of nsqadmin sees the whole cluster.

    nsqadmin_nodes{state="answered"} 2        nsqadmin_topic_depth{topic="t"} 12
    nsqadmin_channel_in_flight{topic="t",channel="c"} 3

``nsqadmin_nodes`` says how many nodes the totals cover, so a scrape during an outage is not read as a drop in
traffic (the failing node's text is in ``nsqadmin_upstream_warnings``). Built per scrape by a collector.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["exposition", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TOPIC = (("depth", "depth", "Messages waiting in the topic, over all nodes", GaugeMetricFamily),
          ("backend_depth", "backend_depth", "Part of the depth held on disk", GaugeMetricFamily),
          ("messages", "message_count", "Messages published to the topic, over all nodes", CounterMetricFamily),
          ("paused", "paused", "1 while the topic is paused on any node", GaugeMetricFamily))
_CHANNEL = (("depth", "depth", "Messages waiting in the channel, over all nodes", GaugeMetricFamily),
            ("backend_depth", "backend_depth", "Part of the depth held on disk", GaugeMetricFamily),
            ("in_flight", "in_flight_count", "Messages delivered and not yet finished", GaugeMetricFamily),
            ("deferred", "deferred_count", "Deferred messages", GaugeMetricFamily),
            ("messages", "message_count", "Messages delivered to the channel", CounterMetricFamily),
            ("requeues", "requeue_count", "Messages requeued", CounterMetricFamily),
            ("timeouts", "timeout_count", "Messages that timed out in flight", CounterMetricFamily),
            ("clients", "client_count", "Consumers connected", GaugeMetricFamily),
            ("paused", "paused", "1 while the channel is paused on any node", GaugeMetricFamily))

_POLICY = (("dead_lettered", "dead_lettered_count", "Messages moved to a dead-letter topic, over all nodes"),
           ("expired", "expired_count", "Messages dropped for their TTL, over all nodes"),
           ("dropped", "dropped_count", "Oldest messages dropped by full channels, over all nodes"))


class _Totals:
    def __init__(self, topics, warnings, answered, asked):
        self.topics, self.warnings, self.answered, self.asked = topics, warnings, answered, asked

    def collect(self):
        nodes = GaugeMetricFamily("nsqadmin_nodes", "nsqd nodes the totals cover, and those that did not answer",
                                  labels=["state"])
        nodes.add_metric(["answered"], self.answered)
        nodes.add_metric(["listed"], self.asked)
        yield nodes
        yield GaugeMetricFamily("nsqadmin_upstream_warnings", "Partial failures while gathering these totals",
                                value=len(self.warnings))
        for name, key, text, cls in _TOPIC:
            fam = cls(f"nsqadmin_topic_{name}", text, labels=["topic"])
            for t in self.topics:
                fam.add_metric([t["topic_name"]], float(t[key]))
            yield fam
        for name, key, text, cls in _CHANNEL:
            fam = cls(f"nsqadmin_channel_{name}", text, labels=["topic", "channel"])
            for t in self.topics:
                for c in t["channels"]:
                    fam.add_metric([t["topic_name"], c["channel_name"]], float(c[key]))
            yield fam
        # nsqpy's policies: only channels whose nodes report them (nsqpy nsqd with a policy or a count)
        for name, key, text in _POLICY:
            fam = CounterMetricFamily(f"nsqadmin_channel_{name}", text, labels=["topic", "channel"])
            for t in self.topics:
                for c in t["channels"]:
                    if key in c:
                        fam.add_metric([t["topic_name"], c["channel_name"]], float(c[key]))
            yield fam


def exposition(topics, warnings, answered: int, asked: int) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Totals(topics, warnings, answered, asked))
    return generate_latest(registry)
