"""nsqd ``/stats`` rows in Go nsqadmin's shapes (internal/clusterinfo's TopicStats, ChannelStats, ClientStats),
and their sums over nodes.

A per-node row is what one nsqd said plus ``node`` (its HTTP address), ``hostname``, ``memory_depth`` (depth
minus backend depth) and, for a client, ``connected`` (nanoseconds since ``connect_ts``, as a Go
time.Duration). A total row has ``node`` "*" and lists its per-node rows under ``nodes``, sorted by hostname;
e2e latency percentiles are merged quantile by quantile as Go's E2eProcessingLatencyAggregate does (counts add,
max is the max, the average is weighted by count).

Unlike Go, a total never reuses a node's row: Go appends the first node's channel object to the topic total and
then adds the others into it, so that node's own row shows the sum; here every total is a new object.
"""
from __future__ import annotations

import time

__all__ = ["topic_row", "channel_row", "client_row", "TopicTotal", "ChannelTotal", "e2e_row"]

_TOPIC_SUMS = ("depth", "memory_depth", "backend_depth", "message_count")
_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count", "requeue_count",
                 "timeout_count", "message_count", "client_count")
_CLIENT_FIELDS = (("remote_address", ""), ("version", ""), ("client_id", ""), ("hostname", ""),
                  ("user_agent", ""), ("connect_ts", 0))
_CLIENT_COUNTS = (("in_flight_count", 0), ("ready_count", 0), ("finish_count", 0), ("requeue_count", 0),
                  ("message_count", 0), ("sample_rate", 0), ("deflate", False), ("snappy", False),
                  ("authed", False), ("auth_identity", ""), ("auth_identity_url", ""), ("tls", False),
                  ("tls_cipher_suite", ""), ("tls_version", ""), ("tls_negotiated_protocol", ""),
                  ("tls_negotiated_protocol_is_mutual", False))


def e2e_row(raw, topic: str, channel: str, host: str) -> dict:
    """An nsqd e2e_processing_latency object as Go's aggregate type reads it: every percentile also gets
    min/max/average (its value) and count."""
    raw = raw or {}
    count = int(raw.get("count") or 0)
    percentiles = raw.get("percentiles")
    if percentiles is not None:
        percentiles = [dict(p, min=p.get("value", 0.0), max=p.get("value", 0.0), average=p.get("value", 0.0),
                            count=float(count)) for p in percentiles]
    return {"count": count, "percentiles": percentiles, "topic": raw.get("topic", topic),
            "channel": raw.get("channel", channel), "host": raw.get("host", host)}


def _e2e_add(total: dict, part: dict) -> None:
    total["host"] = "*"
    total["count"] += part["count"]
    for value in part["percentiles"] or ():
        mine = next((p for p in total["percentiles"] or () if p.get("quantile") == value.get("quantile")), None)
        if mine is None:
            mine = {"quantile": value.get("quantile"), "max": 0.0, "min": 0.0, "count": 0.0, "average": 0.0}
            total["percentiles"] = (total["percentiles"] or []) + [mine]
        mine["max"] = max(value["max"], mine["max"])
        mine["min"] = min(value["min"], mine["min"]) if mine["count"] else value["min"]
        mine["count"] += value["count"]
        if mine["count"] == 0:
            mine["average"] = 0.0
            continue
        mine["average"] += (value["average"] - mine["average"]) * value["count"] / mine["count"]
    if total["percentiles"]:
        total["percentiles"].sort(key=lambda p: -(p.get("quantile") or 0))


def client_row(raw: dict, node: str, now: float | None = None) -> dict:
    row = {"node": node}
    for key, default in _CLIENT_FIELDS:
        row[key] = raw.get(key, default)
    now = int(time.time() if now is None else now)
    row["connected"] = max(0, now - int(row["connect_ts"] or 0)) * 1_000_000_000
    for key, default in _CLIENT_COUNTS:
        row[key] = raw.get(key, default)
    return row


def channel_row(raw: dict, topic: str, node: str, hostname: str, now: float | None = None) -> dict:
    depth, backend = int(raw.get("depth", 0)), int(raw.get("backend_depth", 0))
    name = raw.get("channel_name", "")
    clients = raw.get("clients") or []
    return {"node": node, "hostname": hostname, "topic_name": topic, "channel_name": name, "depth": depth,
            "memory_depth": depth - backend, "backend_depth": backend,
            "in_flight_count": int(raw.get("in_flight_count", 0)), "deferred_count": int(raw.get("deferred_count", 0)),
            "requeue_count": int(raw.get("requeue_count", 0)), "timeout_count": int(raw.get("timeout_count", 0)),
            "message_count": int(raw.get("message_count", 0)),
            "client_count": int(raw.get("client_count", len(clients))), "nodes": None,
            "clients": [client_row(c, node, now) for c in clients], "paused": bool(raw.get("paused", False)),
            "e2e_processing_latency": e2e_row(raw.get("e2e_processing_latency"), topic, name, node),
            **_policy_fields(raw)}


# nsqpy's policies (nsqd's /stats has them on a channel that has a policy or counted a drop; Go nsqd never): the
# counters add up over nodes, and a total shows a node's effective policy
_POLICY_SUMS = ("dead_lettered_count", "expired_count", "dropped_count")


def _policy_fields(raw: dict) -> dict:
    if "dropped_count" not in raw:
        return {}
    out = {key: int(raw.get(key, 0)) for key in _POLICY_SUMS}
    if raw.get("policy"):
        out["policy"] = dict(raw["policy"])
    return out


def topic_row(raw: dict, node: str, hostname: str, now: float | None = None) -> dict:
    depth, backend = int(raw.get("depth", 0)), int(raw.get("backend_depth", 0))
    name = raw.get("topic_name", "")
    return {"node": node, "hostname": hostname, "topic_name": name, "depth": depth,
            "memory_depth": depth - backend, "backend_depth": backend,
            "message_count": int(raw.get("message_count", 0)), "nodes": None,
            "channels": [channel_row(c, name, node, hostname, now) for c in raw.get("channels") or []],
            "paused": bool(raw.get("paused", False)),
            "e2e_processing_latency": e2e_row(raw.get("e2e_processing_latency"), name, "", node)}


class _Total:
    SUMS: tuple = ()

    def __init__(self, row: dict):
        self.row = row

    def add(self, part: dict) -> None:
        row = self.row
        row["node"] = "*"
        for key in self.SUMS:
            row[key] += part[key]
        row["paused"] = row["paused"] or part["paused"]
        row["nodes"].append(part)
        row["nodes"].sort(key=lambda r: r["hostname"])
        _e2e_add(row["e2e_processing_latency"], part["e2e_processing_latency"])


class ChannelTotal(_Total):
    SUMS = _CHANNEL_SUMS

    def __init__(self, topic: str, channel: str, node: str = "*"):
        super().__init__({"node": node, "hostname": "", "topic_name": topic, "channel_name": channel,
                          **{k: 0 for k in _CHANNEL_SUMS}, "nodes": [], "clients": [], "paused": False,
                          "e2e_processing_latency": {"count": 0, "percentiles": None, "topic": topic,
                                                     "channel": channel, "host": node}})

    def add(self, part: dict) -> None:
        super().add(part)
        if "dropped_count" in part:
            for key in _POLICY_SUMS:
                self.row[key] = self.row.get(key, 0) + part[key]
            if "policy" in part and "policy" not in self.row:
                self.row["policy"] = dict(part["policy"])
        self.row["clients"].extend(part["clients"])
        self.row["clients"].sort(key=lambda c: c["hostname"])


class TopicTotal(_Total):
    SUMS = _TOPIC_SUMS

    def __init__(self, topic: str, node: str = "*"):
        super().__init__({"node": node, "hostname": "", "topic_name": topic, **{k: 0 for k in _TOPIC_SUMS},
                          "nodes": [], "channels": [], "paused": False,
                          "e2e_processing_latency": {"count": 0, "percentiles": None, "topic": topic,
                                                     "channel": "", "host": node}})
        self._channels: dict[str, ChannelTotal] = {}

    def add(self, part: dict) -> None:
        super().add(part)
        for ch in part["channels"]:
            total = self._channels.get(ch["channel_name"])
            if total is None:
                total = self._channels[ch["channel_name"]] = ChannelTotal(self.row["topic_name"],
                                                                          ch["channel_name"])
                self.row["channels"].append(total.row)
            total.add(ch)
