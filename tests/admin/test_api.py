"""nsqadmin's JSON API (spec 5.2) over real HTTP against a real cluster: two nsqpy nsqd and one nsqpy nsqlookupd.

Every number is checked against the nodes' own /stats, every action's effect on the nodes and on lookupd, with Go
nsqadmin v1.3.0's field names and types. Topics on one node and on both, consumers attached. Each test keeps to
its own topic names (``unique``), so they share the module's cluster.
"""
from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.admin.admin_wire import (eventually, http_name, node_channel, node_stats, node_topic, on_lookupd,
                                    q)
from tests.broker.wire import consumer, producer, unique

TOPIC_FIELDS = ["node", "hostname", "topic_name", "depth", "memory_depth", "backend_depth", "message_count",
                "nodes", "channels", "paused", "e2e_processing_latency"]
CHANNEL_FIELDS = ["node", "hostname", "topic_name", "channel_name", "depth", "memory_depth", "backend_depth",
                  "in_flight_count", "deferred_count", "requeue_count", "timeout_count", "message_count",
                  "client_count", "nodes", "clients", "paused", "e2e_processing_latency"]
CLIENT_FIELDS = ["node", "remote_address", "version", "client_id", "hostname", "user_agent", "connect_ts",
                 "connected", "in_flight_count", "ready_count", "finish_count", "requeue_count", "message_count",
                 "sample_rate", "deflate", "snappy", "authed", "auth_identity", "auth_identity_url", "tls",
                 "tls_cipher_suite", "tls_version", "tls_negotiated_protocol", "tls_negotiated_protocol_is_mutual"]
PRODUCER_FIELDS = ["remote_addresses", "remote_address", "hostname", "broadcast_address", "tcp_port", "http_port",
                   "version", "topics", "out_of_date"]


class Receiver:
    """An HTTP endpoint that keeps every JSON body POSTed to it (nsqadmin's notifications)."""

    def __init__(self):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/notify"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def admin(cluster, admin_factory, receiver):
    return admin_factory(f"--lookupd-http-address={cluster.lookupd.http}",
                         f"--notification-http-endpoint={receiver.url}")



@pytest.fixture(scope="module")
def both(cluster):
    """A topic on both nodes (3 + 2 messages) with channel "ch" (a consumer on node 1, RDY 0) and "idle"."""
    n1, n2 = cluster.nodes
    topic = unique("both")
    producer(n1.address, topic, b"a", b"b", b"c")
    producer(n2.address, topic, b"d", b"e")
    c = consumer(n1.address, topic, "ch", user_agent="admin-test/1.0", feature_negotiation=True)
    consumer(n2.address, topic, "idle").close()
    on_lookupd(cluster, topic, 2)
    yield topic, c
    c.close()


def test_topics_lists_topics_of_every_node(cluster, admin, both):
    n2 = cluster.nodes[1]
    solo = unique("solo")
    producer(n2.address, solo, b"x")
    on_lookupd(cluster, solo, 1)
    doc = admin.get("/api/topics")
    assert set(doc) == {"topics", "message"} and doc["message"] == ""
    assert {both[0], solo} <= set(doc["topics"]) and doc["topics"] == sorted(doc["topics"])


def test_topic_is_the_sum_of_the_nodes_stats(cluster, admin, both):
    topic, _ = both
    doc = admin.get(f"/api/topics/{q(topic)}")
    assert list(doc) == TOPIC_FIELDS + ["message"] and doc["message"] == ""
    per_node = {http_name(n): node_topic(n, topic) for n in cluster.nodes}
    assert doc["node"] == "*" and doc["topic_name"] == topic
    for key in ("depth", "backend_depth", "message_count"):
        assert doc[key] == sum(t[key] for t in per_node.values()), key
    assert doc["message_count"] == 5
    rows = {r["node"]: r for r in doc["nodes"]}
    assert set(rows) == set(per_node)
    for node, row in rows.items():
        assert list(row) == TOPIC_FIELDS
        assert (row["depth"], row["message_count"]) == (per_node[node]["depth"], per_node[node]["message_count"])
        assert row["memory_depth"] == row["depth"] - row["backend_depth"]
    channels = {c["channel_name"]: c for c in doc["channels"]}
    assert set(channels) == {"ch", "idle"}
    ch = channels["ch"]
    assert list(ch) == CHANNEL_FIELDS and ch["node"] == "*"
    own = {http_name(n): node_channel(n, topic, "ch") for n in cluster.nodes}
    own = {name: c for name, c in own.items() if c is not None}
    for key in ("depth", "message_count", "client_count", "in_flight_count", "requeue_count"):
        assert ch[key] == sum(c[key] for c in own.values()), key
    assert ch["client_count"] == 1
    assert sorted(r["node"] for r in ch["nodes"]) == sorted(own)
    e2e = doc["e2e_processing_latency"]
    assert set(e2e) == {"count", "percentiles", "topic", "channel", "host"} and e2e["host"] == "*"


def test_channel_lists_its_clients_with_their_attributes(cluster, admin, both):
    topic, _ = both
    doc = admin.get(f"/api/topics/{q(topic)}/ch")
    assert list(doc) == CHANNEL_FIELDS + ["message"]
    own = node_channel(cluster.nodes[0], topic, "ch")
    assert doc["depth"] == own["depth"] and doc["client_count"] == own["client_count"] == 1
    [client] = doc["clients"]
    [theirs] = own["clients"]
    assert list(client) == CLIENT_FIELDS
    assert client["node"] == cluster.http_names[0]
    for key in ("remote_address", "client_id", "hostname", "user_agent", "ready_count", "in_flight_count",
                "finish_count", "requeue_count", "message_count", "tls", "snappy", "deflate", "connect_ts"):
        assert client[key] == theirs[key], key
    assert client["user_agent"] == "admin-test/1.0"
    assert isinstance(client["connected"], int) and client["connected"] >= 0  # a Go time.Duration: nanoseconds


def test_nodes_and_one_node(cluster, admin, both):
    topic, _ = both
    doc = admin.get("/api/nodes")
    nodes = {f"{p['broadcast_address']}:{p['http_port']}": p for p in doc["nodes"]}
    assert set(nodes) == set(cluster.http_names) and doc["message"] == ""
    for name, n in zip(cluster.http_names, cluster.nodes):
        p = nodes[name]
        assert list(p) == PRODUCER_FIELDS
        assert p["tcp_port"] == n.port and p["version"] == "1.3.0" and p["out_of_date"] is False
        assert len(p["remote_addresses"]) == 1 and p["remote_addresses"][0].startswith(cluster.lookupd.http + "/")
        assert {"topic": topic, "tombstoned": False} in p["topics"]
    n1 = cluster.nodes[0]
    one = admin.get(f"/api/nodes/{q(cluster.http_names[0])}")
    stats = node_stats(n1)
    assert set(one) == {"node", "topics", "total_messages", "total_clients", "message"}
    assert one["node"] == cluster.http_names[0]
    assert one["total_messages"] == sum(t["message_count"] for t in stats["topics"])
    assert one["total_clients"] == sum(len(c["clients"]) for t in stats["topics"] for c in t["channels"])
    assert {t["topic_name"] for t in one["topics"]} == {t["topic_name"] for t in stats["topics"]}
    status, doc = admin.call("GET", "/api/nodes/127.0.0.1:1")
    assert (status, doc) == (404, {"message": "NODE_NOT_FOUND"})


def test_counter_counts_each_channel_on_each_node(cluster, admin, both):
    topic, _ = both
    stats = admin.get("/api/counter")["stats"]
    for name, n in zip(cluster.http_names, cluster.nodes):
        for channel in ("ch", "idle"):
            own = node_channel(n, topic, channel)
            key = f"{topic}:{channel}:{name}"
            if own is None:
                assert key not in stats
                continue
            assert stats[key] == {"node": name, "topic_name": topic, "channel_name": channel,
                                  "message_count": own["message_count"]}


def test_metrics_are_cluster_totals(cluster, admin, both):
    topic, _ = both
    status, headers, body = admin.request("GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    text = body.decode()
    total = sum(node_topic(n, topic)["message_count"] for n in cluster.nodes)
    assert f'nsqadmin_topic_messages_total{{topic="{topic}"}} {float(total)}' in text
    assert 'nsqadmin_nodes{state="answered"} 2.0' in text
    assert f'nsqadmin_channel_clients{{channel="ch",topic="{topic}"}} 1.0' in text


def test_create_in_lookupd_and_inactive_listing(cluster, admin, receiver):
    topic = unique("made")
    status, doc = admin.call("POST", "/api/topics", {"topic": topic, "channel": "first"})
    assert (status, doc) == (200, {"message": ""})
    lk = cluster.lookupd
    assert topic in lk.get_json("/topics")["topics"]
    assert lk.get_json(f"/channels?topic={q(topic)}")["channels"] == ["first"]
    inactive = admin.get("/api/topics?inactive=true")
    assert inactive["topics"][topic] == ["first"]
    eventually(lambda: [b for b in receiver.bodies if b.get("topic") == topic and b["action"] == "create_channel"],
               what="create notifications")
    actions = [b["action"] for b in receiver.bodies if b.get("topic") == topic]
    assert actions == ["create_topic", "create_channel"]


def test_create_channel_of_a_produced_topic_reaches_its_producers(cluster, admin):
    n1, n2 = cluster.nodes
    topic = unique("newch")
    producer(n1.address, topic, b"1")
    producer(n2.address, topic, b"2")
    on_lookupd(cluster, topic, 2)
    assert admin.call("POST", "/api/topics", {"topic": topic, "channel": "added"}) == (200, {"message": ""})
    assert all(node_channel(n, topic, "added") is not None for n in cluster.nodes)
    assert "added" in cluster.lookupd.get_json(f"/channels?topic={q(topic)}")["channels"]


def test_pause_empty_and_delete_reach_every_producer(cluster, admin, both, receiver):
    n1, n2 = cluster.nodes
    topic = unique("act")
    producer(n1.address, topic, b"1", b"2")
    producer(n2.address, topic, b"3")
    consumer(n1.address, topic, "gone").close()
    consumer(n2.address, topic, "gone").close()
    on_lookupd(cluster, topic, 2)
    path = f"/api/topics/{q(topic)}"
    assert admin.call("POST", path, {"action": "pause"}) == (200, {"message": ""})
    assert all(node_topic(n, topic)["paused"] for n in cluster.nodes)
    assert admin.get(path)["paused"] is True
    assert admin.call("POST", path, {"action": "unpause"})[0] == 200
    assert not any(node_topic(n, topic)["paused"] for n in cluster.nodes)
    assert admin.call("POST", f"{path}/gone", {"action": "pause"})[0] == 200
    assert all(node_channel(n, topic, "gone")["paused"] for n in cluster.nodes)
    assert admin.call("POST", f"{path}/gone", {"action": "unpause"})[0] == 200
    assert all(node_channel(n, topic, "gone")["depth"] > 0 for n in cluster.nodes)
    assert admin.call("POST", f"{path}/gone", {"action": "empty"})[0] == 200
    assert all(node_channel(n, topic, "gone")["depth"] == 0 for n in cluster.nodes)
    assert admin.call("DELETE", f"{path}/gone") == (200, {"message": ""})
    assert all(node_channel(n, topic, "gone") is None for n in cluster.nodes)
    assert cluster.lookupd.get_json(f"/channels?topic={q(topic)}")["channels"] == []
    assert admin.call("POST", path, {"action": "empty"})[0] == 200
    assert all(node_topic(n, topic)["depth"] == 0 for n in cluster.nodes)
    assert admin.call("DELETE", path) == (200, {"message": ""})
    assert all(node_topic(n, topic) is None for n in cluster.nodes)
    assert topic not in cluster.lookupd.get_json("/topics")["topics"]
    want = ["pause_topic", "unpause_topic", "pause_channel", "unpause_channel", "empty_channel", "delete_channel",
            "empty_topic", "delete_topic"]
    eventually(lambda: len([b for b in receiver.bodies if b.get("topic") == topic]) == len(want),
               what="every action notified")
    got = [b for b in receiver.bodies if b.get("topic") == topic]
    assert [b["action"] for b in got] == want
    note = got[2]
    assert note["channel"] == "gone" and "node" not in note and "user" not in note
    assert set(note) == {"action", "topic", "channel", "timestamp", "remote_ip", "user_agent", "url", "via"}
    assert note["url"] == f"{admin.url}{path}/gone" and note["remote_ip"].startswith("127.0.0.1:")


def test_tombstone_marks_lookupd_and_deletes_on_the_node(cluster, admin, receiver):
    n1, n2 = cluster.nodes
    topic = unique("tomb")
    producer(n1.address, topic, b"1")
    producer(n2.address, topic, b"2")
    on_lookupd(cluster, topic, 2)
    node = cluster.http_names[1]
    auth = "Basic " + base64.b64encode(b"carol:secret").decode()
    status, doc = admin.call("DELETE", f"/api/nodes/{q(node)}", {"topic": topic}, {"Authorization": auth})
    assert (status, doc) == (200, {"message": ""})
    assert node_topic(n2, topic) is None and node_topic(n1, topic) is not None
    assert cluster.lookupd.producer_ports(topic) == [n1.port]  # tombstoned producers are not handed out
    eventually(lambda: [b for b in receiver.bodies if b.get("topic") == topic], what="tombstone notification")
    [note] = [b for b in receiver.bodies if b.get("topic") == topic]
    assert (note["action"], note["node"], note["user"]) == ("tombstone_topic_producer", node, "carol")


def test_admin_users_and_config_cidr(cluster, admin_factory):
    a = admin_factory(f"--lookupd-http-address={cluster.lookupd.http}", "--admin-user=alice",
                      "--allow-config-from-cidr=10.0.0.0/8")
    topic = unique("acl")
    for method, path, body in (("POST", "/api/topics", {"topic": topic}),
                               ("POST", f"/api/topics/{topic}", {"action": "pause"}),
                               ("DELETE", f"/api/topics/{topic}", None),
                               ("DELETE", f"/api/nodes/{cluster.http_names[0]}", {"topic": topic})):
        assert a.call(method, path, body) == (403, {"message": "FORBIDDEN"}), path
        assert a.call(method, path, body, {"X-Forwarded-User": "mallory"})[0] == 403
    assert a.call("POST", "/api/topics", {"topic": topic}, {"X-Forwarded-User": "alice"}) == (200, {"message": ""})
    assert topic in cluster.lookupd.get_json("/topics")["topics"]
    assert a.call("GET", "/config/log_level") == (403, {"message": "FORBIDDEN"})  # 127.0.0.1 is not in 10/8
    status, _, page = a.request("GET", "/topics")
    assert status == 200 and b'"is_admin": false' in page


def test_config_reads_and_changes_options(cluster, admin_factory):
    a = admin_factory(f"--lookupd-http-address={cluster.lookupd.http}")
    assert a.call("GET", "/config/nsqlookupd_http_addresses") == (200, [cluster.lookupd.http])
    assert a.call("GET", "/config/log_level") == (200, 2)
    assert a.call("PUT", "/config/log_level", "debug") == (200, 1)
    assert a.call("PUT", "/config/log_level", "loud") == (400, {"message": "INVALID_VALUE"})
    assert a.call("PUT", "/config/log_level", "") == (413, {"message": "INVALID_VALUE"})
    assert a.call("PUT", "/config/http_address", "x") == (400, {"message": "INVALID_OPTION"})
    assert a.call("GET", "/config/no_such_option") == (400, {"message": "INVALID_OPTION"})
    assert a.call("PUT", "/config/nsqlookupd_http_addresses", "[1]") == (400, {"message": "INVALID_VALUE"})
    dead = "127.0.0.1:1"
    assert a.call("PUT", "/config/nsqlookupd_http_addresses", json.dumps([cluster.lookupd.http, dead])) == \
        (200, [cluster.lookupd.http, dead])
    doc = a.get("/api/topics")  # the new list is used at once: the dead lookupd is named
    assert doc["message"].startswith("WARNING: ") and f"dial tcp {dead}: connect: connection refused" in doc["message"]


def test_bad_input_gets_nsq_codes_never_a_traceback(cluster, admin, both):
    topic, _ = both
    cases = [
        ("GET", "/api/nope", None, 404, "NOT_FOUND"),
        ("GET", "/nope/deeper/still/more", None, 404, "NOT_FOUND"),
        ("PUT", f"/api/topics/{topic}", None, 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/api/topics", {"topic": "bad name!"}, 400, "INVALID_TOPIC"),
        ("POST", "/api/topics", {"topic": "x" * 65}, 400, "INVALID_TOPIC"),
        ("POST", "/api/topics", {"topic": "ok", "channel": "bad/channel"}, 400, "INVALID_CHANNEL"),
        ("POST", "/api/topics", "not json", 400, "invalid character 'o' in literal null (expecting 'u')"),
        ("POST", "/api/topics", "<xml/>", 400, "invalid character '<' looking for beginning of value"),
        ("POST", "/api/topics", "", 400, "EOF"),
        ("POST", f"/api/topics/{topic}", {"action": "explode"}, 400, "INVALID_ACTION"),
        ("POST", f"/api/topics/{topic}/ch", {}, 400, "INVALID_ACTION"),
        ("POST", f"/api/topics/{topic}", "{", 400, "unexpected EOF"),
        ("DELETE", f"/api/nodes/{cluster.http_names[0]}", "nope", 400, "INVALID_BODY"),
        ("DELETE", f"/api/nodes/{cluster.http_names[0]}", {"topic": "bad name"}, 400, "INVALID_TOPIC"),
        ("GET", "/api/graphite?metric=rate", None, 400, "INVALID_ARG_TARGET"),
        ("GET", "/api/graphite?metric=speed&target=x", None, 400, "INVALID_ARG_METRIC"),
    ]
    for method, path, body, status, message in cases:
        assert admin.call(method, path, body) == (status, {"message": message}), (method, path)
    # a topic no lookupd knows: every lookupd answered 404, so nothing was asked of any nsqd: 502, as Go
    missing = unique("missing")
    for method, path, body in (("GET", f"/api/topics/{missing}", None),
                               ("POST", f"/api/topics/{missing}", {"action": "pause"}),
                               ("DELETE", f"/api/topics/{missing}", None)):
        status, doc = admin.call(method, path, body)
        assert status == 502 and doc["message"].startswith("UPSTREAM_ERROR: failed to query any nsqlookupd: "), doc
        assert "TOPIC_NOT_FOUND" in doc["message"]
    status, headers, body = admin.request("GET", "/static/../../setup.cfg")
    assert status == 404 and b"[metadata]" not in body
    assert admin.request("GET", "/ping")[2] == b"OK"


def test_unreachable_lookupd_and_nodes(cluster, admin_factory):
    dead = "127.0.0.1:1"
    alone = admin_factory(f"--lookupd-http-address={dead}")
    status, doc = alone.call("GET", "/api/topics")
    assert status == 502
    assert doc["message"] == (f'UPSTREAM_ERROR: failed to query any nsqlookupd: Get "http://{dead}/topics": '
                              f"dial tcp {dead}: connect: connection refused")
    assert alone.call("GET", "/api/nodes")[0] == 502
    health = alone.get("/api/health")
    assert health["nodes"] == [] and "failed to query any nsqlookupd" in health["message"]
    direct = admin_factory(f"--nsqd-http-address={cluster.http_names[0]}", f"--nsqd-http-address={dead}")
    doc = direct.get("/api/nodes")
    assert [f"{p['broadcast_address']}:{p['http_port']}" for p in doc["nodes"]] == [cluster.http_names[0]]
    assert doc["message"].startswith("WARNING: ") and f"dial tcp {dead}" in doc["message"]
    health = direct.get("/api/health")
    assert {d["node"] for d in health["down"]} == {dead} and health["message"] == ""  # said once, as "down"
    assert "connection refused" in health["down"][0]["error"]


def test_a_stopped_node_is_named_not_silently_dropped(cluster, admin_factory):
    """Go's UI shows a topic's totals a third smaller when one of three nodes stops; here the warning names it and
    the health strip lists it as down, with lookupd (which forgets a stopped nsqd) and with direct addresses."""
    extra = cluster.start_node(13)
    topic = unique("stop")
    for n in (cluster.nodes[0], extra):
        producer(n.address, topic, b"m")
    on_lookupd(cluster, topic, 2)
    by_lookupd = admin_factory(f"--lookupd-http-address={cluster.lookupd.http}")
    direct = admin_factory(*(f"--nsqd-http-address={http_name(n)}" for n in (cluster.nodes[0], extra)))
    for a in (by_lookupd, direct):
        assert a.get(f"/api/topics/{q(topic)}")["message_count"] == 2
        assert topic in a.get("/api/topics")["topics"]
        assert len(a.get("/api/health")["nodes"]) >= 2
    gone = http_name(extra)
    assert extra.stop() == 0
    for a in (by_lookupd, direct):
        doc = a.get(f"/api/topics/{q(topic)}")
        assert doc["message_count"] == 1
        assert doc["message"].startswith("WARNING: ") and gone in doc["message"], doc["message"]
        assert gone in a.get("/api/nodes")["message"]
        health = eventually(lambda: (lambda h: h if gone in {d["node"] for d in h["down"]} else None)(
            a.get("/api/health")), what="the stopped node in the health strip")
        assert not [n for n in health["nodes"] if n["node"] == gone][0]["ok"]


class FakeGraphite:
    """A graphite render endpoint: answers every GET with one datapoint and keeps the queries it got."""

    def __init__(self, value):
        self.queries: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.queries.append(self.path)
                body = json.dumps([{"target": "x", "datapoints": [[value, 1]]}]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_graphite_rate_and_proxy(cluster, admin_factory):
    from urllib.parse import parse_qs, urlsplit
    graphite = FakeGraphite(125.0)
    try:
        a = admin_factory(f"--lookupd-http-address={cluster.lookupd.http}", f"--graphite-url={graphite.url}",
                          "--proxy-graphite", "--statsd-interval=10s")
        assert a.get("/api/graphite?metric=rate&target=sumSeries(x)") == {"rate": "12.50"}
        query = parse_qs(urlsplit(graphite.queries[-1]).query)
        assert query == {"from": ["-20sec"], "until": ["-10sec"], "format": ["json"], "target": ["sumSeries(x)"]}
        status, headers, body = a.request("GET", "/render?target=y&format=json")
        assert status == 200 and json.loads(body)[0]["datapoints"] == [[125.0, 1]]
        assert graphite.queries[-1] == "/render?target=y&format=json"
        _, _, page = a.request("GET", "/")
        assert b'"graph_enabled": true' in page
    finally:
        graphite.close()
    assert a.call("GET", "/api/graphite?metric=rate&target=x") == (500, {"message": "INTERNAL_ERROR"})
    no_proxy = admin_factory(f"--lookupd-http-address={cluster.lookupd.http}")
    assert no_proxy.call("GET", "/render?target=y") == (404, {"message": "NOT_FOUND"})


def test_health_finds_a_channel_whose_depth_keeps_growing(cluster, admin):
    """Beyond Go: a channel with no consumer whose depth rose in each of the last samples is named in the health
    strip. One message is published after each new sample, so the depth grows sample by sample."""
    n1 = cluster.nodes[0]
    topic = unique("grow")
    producer(n1.address, topic, b"0")
    consumer(n1.address, topic, "lag").close()
    seen = []

    def growing():
        h = admin.get("/api/health")
        if not seen or h["sampled_at"] != seen[-1]:
            seen.append(h["sampled_at"])
            producer(n1.address, topic, b"more")
        return [g for g in h["growing"] if (g["topic"], g["channel"]) == (topic, "lag")]
    [g] = eventually(growing, what="the growing channel in the health findings")
    assert g["node"] == cluster.http_names[0] and g["depth"] >= 3
    assert all(h["ok"] for h in admin.get("/api/health")["nodes"])


def test_a_restarted_node_is_flagged(cluster, admin):
    """Beyond Go: a node whose start time changed between two samples (it restarted: its counters began again) is
    named in the health findings. The restarted node keeps its HTTP port, so it is the same node to nsqadmin."""
    first = cluster.start_node(14)
    name = http_name(first)
    producer(first.address, unique("restart"), b"m")
    eventually(lambda: any(n["node"] == name and n["ok"] for n in admin.get("/api/health")["nodes"]),
               what="the node sampled once")
    assert first.stop() == 0
    again = cluster.start_node(14, f"--http-address={name}", data=first.data_path)
    assert http_name(again) == name
    health = eventually(lambda: (lambda h: h if name in {r["node"] for r in h["restarted"]} else None)(
        admin.get("/api/health")), what="the restart in the health findings")
    assert "start_time" in [r for r in health["restarted"] if r["node"] == name][0]["why"]


def test_systemd_readiness_and_a_clean_ctrl_c(cluster, tmp_path, monkeypatch):
    """deploy/systemd/nsqadmin.service is Type=notify: READY=1 comes once the HTTP port serves; ^C in a terminal
    (SIGINT to the whole process group) is a clean stop, exit 0, as SIGTERM is."""
    import os
    import signal
    import socket

    from tests.admin.admin_wire import Admin
    path = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    listener.settimeout(60)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    a = Admin(f"--lookupd-http-address={cluster.lookupd.http}")
    try:
        note = ""
        while "READY=1" not in note.split("\n"):  # (STATUS= lines may come first)
            note = listener.recv(4096).decode()
        assert f"MAINPID={a.proc.pid}" in note
        assert a.request("GET", "/ping")[2] == b"OK"
        os.killpg(a.proc.pid, signal.SIGINT)
        assert a.proc.wait(60) == 0
        assert "Traceback" not in a.output()
    finally:
        a.stop()
        listener.close()
