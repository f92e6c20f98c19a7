"""Helpers of the nsqadmin tests: a real ``nsqadmin`` (``python -m nsqpy.http_api.nsqadmin.main``) on port 0 that
announces its address in NSQ's listening line, plain HTTP to it and to the nodes, and a cluster description.

Every wait polls a condition with a deadline (``eventually``): the machine is small and shared, and the
deadlines cost nothing when things are right.
"""
from __future__ import annotations

import http.client
import json
import re
from urllib.parse import quote

from tests.logged_process import LoggedProcess
from tests.polling import wait_until

HTTP_RE = re.compile(r"HTTP: listening on \[?([0-9a-fA-F.:]+?)\]?:(\d+)$")
DEADLINE = 60.0


def eventually(cond, timeout=DEADLINE, what="condition"):
    return wait_until(cond, timeout, what)


def on_lookupd(cluster, topic, count):
    """Wait until the cluster's lookupd hands out ``count`` producers of ``topic``."""
    eventually(lambda: len(cluster.lookupd.producer_ports(topic)) == count, what=f"{topic} on {count} producers")


def q(name: str) -> str:
    return quote(name, safe="")


def request(address, method, path, body=None, headers=None):
    """-> (status, {lower-case header: value}, body bytes) of one request to ``address`` (host, port)."""
    conn = http.client.HTTPConnection(*address, timeout=DEADLINE)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_json(address, path):
    status, headers, body = request(address, "GET", path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def node_stats(nsqd, topic=None):
    """An nsqd's own /stats?format=json (optionally of one topic)."""
    host, port = nsqd.http_address
    return get_json((host, port), "/stats?format=json" + (f"&topic={q(topic)}" if topic else ""))


def node_topic(nsqd, topic):
    """The topic's row in the node's /stats, or None."""
    return next((t for t in node_stats(nsqd)["topics"] if t["topic_name"] == topic), None)


def node_channel(nsqd, topic, channel):
    t = node_topic(nsqd, topic)
    return next((c for c in t["channels"] if c["channel_name"] == channel), None) if t else None


def http_name(nsqd) -> str:
    host, port = nsqd.http_address
    return f"{host}:{port}"


class Admin(LoggedProcess):
    name = "nsqadmin"

    def __init__(self, *flags):
        super().__init__("nsqpy.http_api.nsqadmin.main", ["--http-address=127.0.0.1:0", *flags])
        with self.starting():
            m = self.wait_for_line(HTTP_RE, DEADLINE)
        self.address = (m.group(1), int(m.group(2)))

    @property
    def url(self) -> str:
        return f"http://{self.address[0]}:{self.address[1]}"

    def request(self, method, path, body=None, headers=None):
        return request(self.address, method, path, body, headers)

    def call(self, method, path, body=None, headers=None):
        """-> (status, decoded JSON body); every reply of the API must be JSON with NSQ's V1 headers."""
        status, hdrs, raw = self.request(method, path, body, headers)
        assert hdrs.get("content-type") == "application/json; charset=utf-8", (path, status, hdrs, raw)
        assert hdrs.get("x-nsq-content-type") == "nsq; version=1.0", (path, hdrs)
        return status, json.loads(raw)

    def get(self, path):
        status, doc = self.call("GET", path)
        assert status == 200, (path, status, doc, self.output()[-3000:])
        return doc
