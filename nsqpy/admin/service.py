"""nsqadmin's JSON API as plain calls: one method per route of spec 5.2, returning the reply's JSON object with
Go nsqadmin v1.3.0's field names, or raising ``AdminError(status, text)``.

    svc = AdminService(opts, log)
    svc.topic("t")                    # {"node": "*", "topic_name": "t", ..., "nodes": [...], "message": ""}
    svc.action("t", "", {"action": "pause"}, request_facts)

The Falcon app (http_api/nsqadmin/app.py) only maps routes and request bodies onto these. Every reply's
``message`` is "" or ``WARNING: <each partial failure>`` (Go's maybeWarnMsg); a query that no node answered is
``AdminError(502, "UPSTREAM_ERROR: ...")``; a write from a user not in ``--admin-user`` is 403 FORBIDDEN.

State, held by the one serving process (the app runs one gunicorn worker with threads, so every request sees
it): the options (``/config`` may replace the lookupd addresses and log level at runtime), the health tracker
(which also remembers nodes, to name a vanished one in ``message``) and the notifier.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import socket
import threading
import time
from urllib.parse import urlencode

from nsqpy.protocol.names import is_valid_name

from .aggregate import TopicTotal
from .bodies import BodyError, decode_object, json_error, string_field
from .cluster import ClusterInfo, http_address
from .health import SAMPLE_EVERY, HealthTracker
from .notify import Notifier, RequestFacts, admin_action
from .upstream import Upstream, UpstreamError, tls_context

__all__ = ["AdminService", "AdminError", "warn_message"]

_ACTIONS = ("pause", "unpause", "empty")
_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
MAX_CONFIG_BODY = 1024 * 1024


class AdminError(Exception):
    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status = status
        self.text = text


def warn_message(messages: list[str]) -> str:
    return "WARNING: " + "; ".join(messages) if messages else ""


def _field(doc: dict, key: str) -> str:
    try:
        return string_field(doc, key)
    except BodyError as e:
        raise AdminError(400, str(e)) from None


class AdminService:
    def __init__(self, opts, log=None, upstream: Upstream | None = None, clock=time.time):
        self.opts = opts
        self.log = log
        self.clock = clock
        tls = None
        if opts.http_client_tls_root_ca_file or opts.http_client_tls_cert or opts.http_client_tls_insecure_skip_verify:
            tls = tls_context(opts.http_client_tls_insecure_skip_verify, opts.http_client_tls_root_ca_file,
                              opts.http_client_tls_cert, opts.http_client_tls_key)
        self.upstream = upstream or Upstream(opts.http_client_connect_timeout / 1e9,
                                             opts.http_client_request_timeout / 1e9, tls)
        self.ci = ClusterInfo(self.upstream, log)
        self.notifier = Notifier(opts.notification_http_endpoint, opts.http_client_request_timeout / 1e9, log)
        self.health_tracker = HealthTracker()
        self.via = socket.gethostname()
        self._lock = threading.Lock()       # the tracker and option swaps
        self._health_at = -1e18

    # ---- helpers -------------------------------------------------------------------------------------------

    @property
    def lookupds(self) -> list[str]:
        return list(self.opts.lookupd_http_address)

    @property
    def nsqds(self) -> list[str]:
        return list(self.opts.nsqd_http_address)

    def _warned(self, messages: list[str], what: str, call):
        """call()'s value, its warnings appended to ``messages``; AllFailed becomes 502 UPSTREAM_ERROR."""
        try:
            value, warnings = call()
        except UpstreamError as e:
            if self.log is not None:
                self.log.error(f"failed to {what} - {e}")
            raise AdminError(502, f"UPSTREAM_ERROR: {e}") from None
        if warnings:
            if self.log is not None:
                self.log.warn("\n".join(warnings))
            messages.append("\n".join(warnings))
        return value

    def _remember(self, producers, messages: list[str]) -> None:
        """Note the listed nodes; name the known ones no lookupd lists any more (lookupd mode only: with
        --nsqd-http-address every node is asked and a down one fails its request)."""
        pairs = [(http_address(p), p["hostname"]) for p in producers]
        now = self.clock()
        with self._lock:
            if self.lookupds:
                messages.extend(self.health_tracker.missing(pairs, now))
            self.health_tracker.saw(pairs, now)

    def _all_producers(self, messages):
        producers = self._warned(messages, "get nodes", lambda: self.ci.producers(self.lookupds, self.nsqds))
        self._remember(producers, messages)
        return producers

    def _topic_producers(self, topic, messages):
        producers = self._warned(messages, "get topic producers",
                                 lambda: self.ci.topic_producers(topic, self.lookupds, self.nsqds))
        if self.lookupds:
            try:  # a node that vanished from lookupd took its share of the topic with it: say so
                everyone, _ = self.ci.lookupd_producers(self.lookupds)
                self._remember(everyone, messages)
            except UpstreamError:
                pass  # the topic query above answered; this one only adds warnings
        return producers

    def is_admin(self, req: RequestFacts) -> bool:
        users = self.opts.admin_user
        return not users or req.acl_user in users

    def _require_admin(self, req: RequestFacts) -> None:
        if not self.is_admin(req):
            raise AdminError(403, "FORBIDDEN")

    def _notify(self, action, topic, channel, node, req):
        self.notifier.send(admin_action(action, topic, channel, node, req, self.via, self.clock()))

    # ---- reads ---------------------------------------------------------------------------------------------

    def topics(self, inactive: bool = False) -> dict:
        messages: list[str] = []
        if self.lookupds:
            topics = self._warned(messages, "get topics", lambda: self.ci.lookupd_topics(self.lookupds))
        else:
            topics = self._warned(messages, "get topics", lambda: self.ci.nsqd_topics(self.nsqds))
        if not inactive:
            return {"topics": topics, "message": warn_message(messages)}
        found: dict[str, list[str]] = {}
        if self.lookupds:
            def channels_if_inactive(topic):
                producers, _ = self.ci.lookupd_topic_producers(topic, self.lookupds)
                if producers:
                    return None
                return self.ci.lookupd_topic_channels(topic, self.lookupds)[0]
            for topic, got in self.upstream.fan_out(channels_if_inactive, topics):
                if isinstance(got, list):
                    found[topic] = got
                elif got is not None:
                    found[topic] = []  # as Go: an unanswered channel query is an empty list
        return {"topics": found, "message": warn_message(messages)}

    def topic(self, topic: str) -> dict:
        messages: list[str] = []
        producers = self._topic_producers(topic, messages)
        rows = self._warned(messages, "get topic metadata",
                            lambda: self._stats(producers, topic, "", False))
        total = TopicTotal(topic)
        for row in rows:
            total.add(row)
        return {**total.row, "message": warn_message(messages)}

    def _stats(self, producers, topic, channel, include_clients):
        rows, channels, warnings = self.ci.nsqd_stats(producers, topic, channel, include_clients)
        return (rows, channels) if channel else rows, warnings

    def channel(self, topic: str, channel: str) -> dict:
        messages: list[str] = []
        producers = self._topic_producers(topic, messages)
        _, channels = self._warned(messages, "get channel metadata",
                                   lambda: self._stats(producers, topic, channel, True))
        total = channels.get(channel)
        if total is None:  # Go marshals a nil *ChannelStats: only the message is left
            return {"message": warn_message(messages)}
        return {**total.row, "message": warn_message(messages)}

    def nodes(self) -> dict:
        messages: list[str] = []
        producers = self._all_producers(messages)
        return {"nodes": producers, "message": warn_message(messages)}

    def node(self, node: str) -> dict:
        messages: list[str] = []
        producers = self._all_producers(messages)
        producer = next((p for p in producers if http_address(p) == node), None)
        if producer is None:
            raise AdminError(404, "NODE_NOT_FOUND")
        try:
            rows, _, _ = self.ci.nsqd_stats([producer], "", "", True)
        except UpstreamError as e:
            raise AdminError(502, f"UPSTREAM_ERROR: {e}") from None
        total_clients = sum(len(c["clients"]) for t in rows for c in t["channels"])
        total_messages = sum(t["message_count"] for t in rows)
        return {"node": node, "topics": rows, "total_messages": total_messages, "total_clients": total_clients,
                "message": warn_message(messages)}

    def counter(self) -> dict:
        messages: list[str] = []
        producers = self._all_producers(messages)
        _, channels = self._warned(messages, "get nsqd stats",
                                   lambda: self._channel_totals(producers))
        stats = {}
        for total in channels.values():
            row = total.row
            for part in row["nodes"]:
                key = f"{row['topic_name']}:{row['channel_name']}:{part['node']}"
                entry = stats.setdefault(key, {"node": part["node"], "topic_name": row["topic_name"],
                                               "channel_name": row["channel_name"], "message_count": 0})
                entry["message_count"] += part["message_count"]
        return {"stats": stats, "message": warn_message(messages)}

    def _channel_totals(self, producers):
        rows, channels, warnings = self.ci.nsqd_stats(producers, "", "", False)
        return (rows, channels), warnings

    def cluster_totals(self) -> tuple[list[dict], list[str], int, int]:
        """(topic totals, warnings, nodes answering, nodes asked) for /metrics."""
        messages: list[str] = []
        producers = self._all_producers(messages)
        rows, _ = self._warned(messages, "get nsqd stats", lambda: self._channel_totals(producers))
        totals: dict[str, TopicTotal] = {}
        for row in rows:
            totals.setdefault(row["topic_name"], TopicTotal(row["topic_name"])).add(row)
        answered = len({row["node"] for row in rows})
        return [t.row for _, t in sorted(totals.items())], messages, answered, len(producers)

    def health(self) -> dict:
        """The health strip's findings, sampled at most every SAMPLE_EVERY seconds."""
        now = self.clock()
        with self._lock:
            if now - self._health_at < SAMPLE_EVERY:
                return {**self.health_tracker.findings, "message": ""}
            self._health_at = now
        messages: list[str] = []
        try:
            producers, warnings = self.ci.producers(self.lookupds, self.nsqds)
            messages += warnings
        except UpstreamError as e:
            producers, messages = [], [str(e)]
        answers = {http_address(p): (got if isinstance(got, dict) else str(got)) for p, got in self.upstream.fan_out(
            lambda p: self.upstream.get_json(f"http://{http_address(p)}/stats?format=json"), producers)}
        if not self.lookupds:  # nsqd mode: a node that did not answer is not in the producer list: add it
            listed = {http_address(p) for p in producers}
            for address in self.nsqds:
                if address not in listed:
                    producers.append({"broadcast_address": address.rpartition(":")[0],
                                      "http_port": address.rpartition(":")[2], "hostname": address})
                    answers[address] = next((m for m in messages if address in m), "no answer")
            messages = []  # each failure is now a "down" node: said once
        pairs = [(http_address(p), p["hostname"]) for p in producers]
        with self._lock:
            found = self.health_tracker.observe(now, pairs, answers)
        return {**found, "message": warn_message(messages)}

    # ---- writes --------------------------------------------------------------------------------------------

    def create(self, body: bytes, req: RequestFacts) -> dict:
        self._require_admin(req)
        doc = decode_object(body)
        if doc is None:
            raise AdminError(400, json_error(body))
        topic, channel = _field(doc, "topic"), _field(doc, "channel")
        if not is_valid_name(topic):
            raise AdminError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise AdminError(400, "INVALID_CHANNEL")
        messages: list[str] = []
        self._warned(messages, "create topic/channel",
                     lambda: (None, self.ci.create_topic_channel(topic, channel, self.lookupds)))
        self._notify("create_topic", topic, "", "", req)
        if channel:
            self._notify("create_channel", topic, channel, "", req)
        return {"message": warn_message(messages)}

    def action(self, topic: str, channel: str, body: bytes, req: RequestFacts) -> dict:
        self._require_admin(req)
        doc = decode_object(body)
        if doc is None:
            raise AdminError(400, json_error(body))
        what = _field(doc, "action")
        if what not in _ACTIONS:
            raise AdminError(400, "INVALID_ACTION")
        messages: list[str] = []
        self._warned(messages, f"{what} topic/channel",
                     lambda: (None, self.ci.producer_action(topic, channel, what, self.lookupds, self.nsqds)))
        self._notify(f"{what}_{'channel' if channel else 'topic'}", topic, channel, "", req)
        return {"message": warn_message(messages)}

    def delete(self, topic: str, channel: str, req: RequestFacts) -> dict:
        self._require_admin(req)
        messages: list[str] = []
        if channel:
            self._warned(messages, "delete channel",
                         lambda: (None, self.ci.delete_channel(topic, channel, self.lookupds, self.nsqds)))
            self._notify("delete_channel", topic, channel, "", req)
        else:
            self._warned(messages, "delete topic",
                         lambda: (None, self.ci.delete_topic(topic, self.lookupds, self.nsqds)))
            self._notify("delete_topic", topic, "", "", req)
        return {"message": warn_message(messages)}

    def tombstone(self, node: str, body: bytes, req: RequestFacts) -> dict:
        self._require_admin(req)
        doc = decode_object(body)
        if doc is None:
            raise AdminError(400, "INVALID_BODY")
        try:
            topic = _field(doc, "topic")
        except AdminError:
            raise AdminError(400, "INVALID_BODY") from None
        if not is_valid_name(topic):
            raise AdminError(400, "INVALID_TOPIC")
        messages: list[str] = []
        self._warned(messages, "tombstone node for topic",
                     lambda: (None, self.ci.tombstone_topic_producer(topic, node, self.lookupds)))
        self._notify("tombstone_topic_producer", topic, "", node, req)
        return {"message": warn_message(messages)}

    # ---- /config/:opt --------------------------------------------------------------------------------------

    def config(self, opt: str, method: str, body: bytes | None, remote_ip: str):
        cidr = self.opts.allow_config_from_cidr
        if cidr:
            try:
                ip = ipaddress.ip_address(remote_ip.strip("[]").split("%")[0])
            except ValueError:
                raise AdminError(400, "INVALID_REMOTE_ADDR") from None
            net = ipaddress.ip_network(cidr, strict=False)
            if ip.version != net.version and ip.version == 6 and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if ip.version != net.version or ip not in net:
                raise AdminError(403, "FORBIDDEN")
        if method == "PUT":
            if not body or len(body) > MAX_CONFIG_BODY:
                raise AdminError(413, "INVALID_VALUE")
            new = dataclasses.replace(self.opts)
            if opt == "nsqlookupd_http_addresses":
                try:
                    value = json.loads(body)
                except ValueError:
                    raise AdminError(400, "INVALID_VALUE") from None
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise AdminError(400, "INVALID_VALUE")
                new.lookupd_http_address = value
            elif opt == "log_level":
                level = _LEVELS.get(body.decode("utf-8", "replace").lower())
                if level is None:
                    raise AdminError(400, "INVALID_VALUE")
                new.log_level = type(self.opts.log_level)(level)
                if self.log is not None:
                    self.log.level = level
            else:
                raise AdminError(400, "INVALID_OPTION")
            with self._lock:
                self.opts = new
        try:
            return self.opts.config_value(opt)
        except KeyError:
            raise AdminError(400, "INVALID_OPTION") from None

    def graphite_rate(self, metric: str | None, target: str | None) -> dict:
        if metric != "rate":
            raise AdminError(400, "INVALID_ARG_METRIC")
        if target is None:
            raise AdminError(400, "INVALID_ARG_TARGET")
        interval = max(1, self.opts.statsd_interval // 1_000_000_000)
        query = urlencode({"from": f"-{interval * 2}sec", "until": f"-{interval}sec", "format": "json",
                           "target": target})
        url = f"{self.opts.graphite_url}/render?{query}"
        if self.log is not None:
            self.log.info(f"GRAPHITE: {url}")
        try:
            doc = self.upstream.get_json(url)
            rate = doc[0]["datapoints"][0][0]
        except (UpstreamError, LookupError, TypeError) as e:
            if self.log is not None:
                self.log.error(f"graphite request failed - {e}")
            raise AdminError(500, "INTERNAL_ERROR") from None
        if rate is None or rate < 0:
            return {"rate": "N/A"}
        return {"rate": f"{rate / interval:.2f}"}
