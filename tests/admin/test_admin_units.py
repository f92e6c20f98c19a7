"""nsqadmin's domain objects alone, with small fakes: sums over nodes in Go's shapes (aggregate), the fan-out's
partial failures (cluster, over a fake Upstream), the health tracker over hand-made samples, notifications'
fields, and the Falcon app's routing and error mapping (falcon.testing, over a fake service)."""
from __future__ import annotations

import base64
import socket
import threading

import falcon.testing
import pytest

from nsqpy.http_api.nsqadmin.app import base_join, create_app, normalize_base_path
from nsqpy.admin.aggregate import ChannelTotal, TopicTotal, channel_row, topic_row
from nsqpy.admin.cluster import AllFailed, ClusterInfo
from nsqpy.admin.health import HealthTracker
from nsqpy.admin.notify import RequestFacts, admin_action, basic_auth_user
from nsqpy.admin.service import AdminError, AdminService, warn_message
from nsqpy.admin.upstream import Upstream, UpstreamError, go_quote
from nsqpy.config.nsqadmin import NsqadminOptions


def raw_topic(name, depth, count, channels=(), backend=0, paused=False, e2e=None):
    return {"topic_name": name, "depth": depth, "backend_depth": backend, "message_count": count, "paused": paused,
            "channels": list(channels), "e2e_processing_latency": e2e or {"count": 0, "percentiles": None}}


def raw_channel(name, depth=0, in_flight=0, count=0, clients=(), paused=False):
    return {"channel_name": name, "depth": depth, "backend_depth": 0, "in_flight_count": in_flight,
            "deferred_count": 0, "message_count": count, "requeue_count": 1, "timeout_count": 2,
            "client_count": len(clients), "clients": list(clients), "paused": paused,
            "e2e_processing_latency": {"count": 0, "percentiles": None}}


def raw_client(addr, ready=1, in_flight=0, count=0):
    return {"client_id": "c", "hostname": "h", "version": "V2", "remote_address": addr, "ready_count": ready,
            "in_flight_count": in_flight, "message_count": count, "finish_count": count, "requeue_count": 0,
            "connect_ts": 100, "user_agent": "ua"}


# ---- aggregate ---------------------------------------------------------------------------------------------

def test_topic_total_sums_nodes_and_keeps_each_row():
    a = topic_row(raw_topic("t", 5, 10, [raw_channel("c", depth=3, count=7)], backend=2), "a:1", "hb")
    b = topic_row(raw_topic("t", 1, 4, [raw_channel("c", depth=1, count=2), raw_channel("d")], paused=True),
                  "b:1", "ha")
    total = TopicTotal("t")
    total.add(a)
    total.add(b)
    row = total.row
    assert (row["node"], row["depth"], row["backend_depth"], row["memory_depth"], row["message_count"]) == \
        ("*", 6, 2, 4, 14)
    assert row["paused"] is True
    assert [r["hostname"] for r in row["nodes"]] == ["ha", "hb"]  # sorted by hostname, as Go
    c = {ch["channel_name"]: ch for ch in row["channels"]}
    assert (c["c"]["depth"], c["c"]["message_count"], c["c"]["requeue_count"], c["c"]["timeout_count"]) == \
        (4, 9, 2, 4)
    assert a["channels"][0]["depth"] == 3  # unlike Go, a node's own row is never turned into the total
    assert [n["node"] for n in c["d"]["nodes"]] == ["b:1"]


def test_client_rows_and_connected_duration():
    ch = channel_row(raw_channel("c", clients=[raw_client("1.2.3.4:5")]), "t", "n:1", "h", now=160)
    [client] = ch["clients"]
    assert client["node"] == "n:1" and client["connected"] == 60 * 10**9
    assert client["tls"] is False and client["auth_identity"] == ""
    total = ChannelTotal("t", "c")
    total.add(ch)
    assert total.row["clients"] == [client] and total.row["client_count"] == 1


def test_e2e_percentiles_merge_by_quantile():
    def e2e(v, n):
        return {"count": n, "percentiles": [{"quantile": 0.99, "value": v}, {"quantile": 0.5, "value": v / 2}]}
    total = TopicTotal("t")
    total.add(topic_row(raw_topic("t", 0, 0, e2e=e2e(100.0, 1)), "a:1", "a"))
    total.add(topic_row(raw_topic("t", 0, 0, e2e=e2e(300.0, 3)), "b:1", "b"))
    agg = total.row["e2e_processing_latency"]
    assert agg["count"] == 4 and agg["host"] == "*"
    p99 = agg["percentiles"][0]
    assert p99["quantile"] == 0.99 and p99["max"] == 300.0 and p99["min"] == 100.0
    assert p99["average"] == pytest.approx(250.0)  # weighted by count
    assert [p["quantile"] for p in agg["percentiles"]] == [0.99, 0.5]


# ---- cluster over a fake upstream --------------------------------------------------------------------------

class FakeUpstream:
    """Answers from a dict url -> JSON (or an UpstreamError to raise); records POSTs."""

    def __init__(self, answers):
        self.answers = answers
        self.posts = []
        self.request_timeout = 1.0

    def get_json(self, url):
        got = self.answers.get(url, UpstreamError(f"no route to {url}"))
        if isinstance(got, UpstreamError):
            raise got
        return got

    def post(self, url):
        self.posts.append(url)
        got = self.answers.get(url)
        if isinstance(got, UpstreamError):
            raise got

    def fan_out(self, fn, items):
        out = []
        for item in items:
            try:
                out.append((item, fn(item)))
            except UpstreamError as e:
                out.append((item, e))
        return out


def test_some_lookupds_failing_is_a_warning_all_failing_is_all_failed():
    up = FakeUpstream({"http://a/topics": {"topics": ["y", "x"]}, "http://b/topics": UpstreamError("b is down")})
    ci = ClusterInfo(up)
    assert ci.lookupd_topics(["a", "b"]) == (["x", "y"], ["b is down"])
    with pytest.raises(AllFailed) as err:
        ci.lookupd_topics(["b"])
    assert str(err.value) == "failed to query any nsqlookupd: b is down"
    with pytest.raises(AllFailed):
        ci.nsqd_stats([], "t")  # nobody to ask: Go's "failed to query any nsqd: "


def test_lookupd_producers_merge_by_tcp_address_and_flag_old_versions():
    node = {"remote_address": "r:1", "hostname": "h", "broadcast_address": "n", "tcp_port": 1, "http_port": 2,
            "version": "1.3.0", "topics": ["b", "a"], "tombstones": [True, False]}
    old = dict(node, tcp_port=5, http_port=6, version="1.2.1", topics=[], tombstones=[])
    up = FakeUpstream({"http://l1/nodes": {"producers": [node, old]}, "http://l2/nodes": {"producers": [node]}})
    producers, warnings = ClusterInfo(up).lookupd_producers(["l1", "l2"])
    assert warnings == []
    first = next(p for p in producers if p["tcp_port"] == 1)
    assert first["remote_addresses"] == ["l1/r:1", "l2/r:1"]
    assert first["topics"] == [{"topic": "a", "tombstoned": False}, {"topic": "b", "tombstoned": True}]
    assert [p["out_of_date"] for p in sorted(producers, key=lambda p: p["tcp_port"])] == [False, True]


def test_actions_go_on_after_a_failing_step_and_collect_warnings():
    lookup = {"producers": [{"broadcast_address": "n1", "http_port": 1, "tcp_port": 9, "hostname": "h",
                             "version": "1.3.0"},
                            {"broadcast_address": "n2", "http_port": 2, "tcp_port": 9, "hostname": "h",
                             "version": "1.3.0"}]}
    up = FakeUpstream({"http://l/lookup?topic=t": lookup,
                       "http://n2:2/topic/pause?topic=t": UpstreamError("n2 refused")})
    warnings = ClusterInfo(up).producer_action("t", "", "pause", ["l"], [])
    assert warnings == ["n2 refused"]
    assert sorted(up.posts) == ["http://n1:1/topic/pause?topic=t", "http://n2:2/topic/pause?topic=t"]


def test_service_message_and_errors():
    assert warn_message([]) == "" and warn_message(["a", "b"]) == "WARNING: a; b"
    opts = NsqadminOptions.parse(["--lookupd-http-address=l", "--admin-user=root"])
    up = FakeUpstream({"http://l/topics": {"topics": ["t"]}})
    svc = AdminService(opts, upstream=up)
    assert svc.topics() == {"topics": ["t"], "message": ""}
    with pytest.raises(AdminError) as err:
        svc.create(b'{"topic":"t"}', RequestFacts(acl_user="guest"))
    assert (err.value.status, err.value.text) == (403, "FORBIDDEN")
    svc.create(b'{"topic":"t"}', RequestFacts(acl_user="root"))
    assert up.posts == ["http://l/topic/create?topic=t"]
    for body, text in ((b"", "EOF"), (b"[1]", "json: cannot unmarshal into Go value"), (b"tru", "unexpected EOF"),
                       (b'{"topic": 5}', "json: cannot unmarshal number into Go struct field .topic of type string")):
        with pytest.raises(AdminError) as err:
            svc.create(body, RequestFacts(acl_user="root"))
        assert (err.value.status, err.value.text) == (400, text), body


# ---- health -------------------------------------------------------------------------------------------------

def sample(start=1, topics=()):
    return {"start_time": start, "topics": list(topics)}


def test_health_names_down_and_vanished_nodes_and_forgets_them():
    h = HealthTracker(forget_after=100)
    f = h.observe(0, [("a:1", "ha"), ("b:1", "hb")], {"a:1": sample(), "b:1": "connection refused"})
    assert [d["node"] for d in f["down"]] == ["b:1"] and f["down"][0]["error"] == "connection refused"
    f = h.observe(10, [("a:1", "ha")], {"a:1": sample()})  # b unregistered from lookupd
    assert [d["node"] for d in f["down"]] == ["b:1"] and "no longer listed" in f["down"][0]["error"]
    assert h.observe(200, [("a:1", "ha")], {"a:1": sample()})["down"] == []


def test_health_sees_restarts_by_start_time_or_counters_going_back():
    h = HealthTracker(restart_shown=30)
    t = lambda count: raw_topic("t", 0, count)  # noqa: E731
    h.observe(0, [("a:1", "h")], {"a:1": sample(1, [t(50)])})
    assert h.observe(2, [("a:1", "h")], {"a:1": sample(1, [t(60)])})["restarted"] == []
    [r] = h.observe(4, [("a:1", "h")], {"a:1": sample(1, [t(3)])})["restarted"]
    assert r["node"] == "a:1" and "60 -> 3" in r["why"]
    [r] = h.observe(6, [("a:1", "h")], {"a:1": sample(9, [t(4)])})["restarted"]
    assert "start_time 1 -> 9" in r["why"]
    assert h.observe(100, [("a:1", "h")], {"a:1": sample(9, [t(5)])})["restarted"] == []


def test_health_growing_depth_needs_every_step_up():
    h = HealthTracker(growing_samples=3)
    grow = lambda d: sample(1, [raw_topic("t", 0, 0, [raw_channel("c", depth=d)])])  # noqa: E731
    for i, depth in enumerate([1, 2, 3]):
        assert h.observe(i, [("a:1", "h")], {"a:1": grow(depth)})["growing"] == []
    [g] = h.observe(3, [("a:1", "h")], {"a:1": grow(4)})["growing"]
    assert (g["topic"], g["channel"], g["depth"]) == ("t", "c", 4)
    assert h.observe(4, [("a:1", "h")], {"a:1": grow(4)})["growing"] == []  # flat is not growing


def test_health_stuck_client_has_rdy_nothing_in_flight_and_waiting_messages():
    h = HealthTracker()
    doc = lambda depth, count, ready=5, paused=False: sample(1, [raw_topic("t", 0, 0, [raw_channel(  # noqa: E731
        "c", depth=depth, paused=paused, clients=[raw_client("x:1", ready=ready, count=count)])])])
    assert h.observe(0, [("a:1", "h")], {"a:1": doc(10, 7)})["stuck"] == []  # one sample says nothing yet
    [s] = h.observe(2, [("a:1", "h")], {"a:1": doc(10, 7)})["stuck"]
    assert (s["remote_address"], s["ready_count"]) == ("x:1", 5)
    assert h.observe(4, [("a:1", "h")], {"a:1": doc(10, 8)})["stuck"] == []   # it received one
    assert h.observe(6, [("a:1", "h")], {"a:1": doc(0, 8)})["stuck"] == []    # nothing waiting: idle
    assert h.observe(8, [("a:1", "h")], {"a:1": doc(5, 8, ready=0)})["stuck"] == []  # RDY 0: its own choice
    assert h.observe(10, [("a:1", "h")], {"a:1": doc(5, 8, paused=True)})["stuck"] == []


# ---- notifications ------------------------------------------------------------------------------------------

def test_admin_action_fields_as_go():
    auth = "Basic " + base64.b64encode(b"bob:pw").decode()
    req = RequestFacts(host="adm:4171", path="/api/topics/t", query="x=1", remote_addr="1.2.3.4:5",
                       user_agent="curl", authorization=auth)
    doc = admin_action("pause_topic", "t", "", "", req, via="box", now=1234.5)
    assert doc == {"action": "pause_topic", "topic": "t", "timestamp": 1234, "user": "bob",
                   "remote_ip": "1.2.3.4:5", "user_agent": "curl", "url": "http://adm:4171/api/topics/t?x=1",
                   "via": "box"}
    assert basic_auth_user("Basic !!!") == "" and basic_auth_user("Bearer x") == ""
    assert basic_auth_user("Basic " + base64.b64encode(b"nocolon").decode()) == ""
    assert admin_action("x", "t", "c", "n", RequestFacts(https=True, host="h"), "v")["url"] == "https://h/"


# ---- the Falcon app ------------------------------------------------------------------------------------------

class FakeService:
    def __init__(self, base="/"):
        self.opts = NsqadminOptions.parse(["--lookupd-http-address=l", f"--base-path={base}"])

    def topics(self, inactive=False):
        return {"topics": ["inactive" if inactive else "t"], "message": ""}

    def topic(self, topic):
        if topic == "boom":
            raise RuntimeError("a bug")
        raise AdminError(502, f"UPSTREAM_ERROR: {topic}")

    def is_admin(self, req):
        return True


@pytest.mark.parametrize("base", ["/", "/ops", "ops/", "//ops//x/"])
def test_base_path_prefixes_every_route(base):
    client = falcon.testing.TestClient(create_app(FakeService(base)))
    root = normalize_base_path(base)
    assert client.simulate_get(base_join(root, "/api/topics")).json == {"topics": ["t"], "message": ""}
    assert client.simulate_get(base_join(root, "/api/topics"), query_string="inactive=true").json["topics"] == \
        ["inactive"]
    page = client.simulate_get(base_join(root, "/topics/x/y"))
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert f'<base href="{"" if root == "/" else root}/">' in page.text
    assert client.simulate_get(base_join(root, "/static/app.js")).status_code == 200
    if root != "/":
        assert client.simulate_get("/api/topics").json == {"message": "NOT_FOUND"}


def test_errors_are_nsq_json_never_a_traceback():
    client = falcon.testing.TestClient(create_app(FakeService()))
    r = client.simulate_get("/api/topics/x")
    assert (r.status_code, r.json) == (502, {"message": "UPSTREAM_ERROR: x"})
    r = client.simulate_get("/api/topics/boom")
    assert (r.status_code, r.json) == (500, {"message": "INTERNAL_ERROR"})
    assert r.headers["x-nsq-content-type"] == "nsq; version=1.0"
    r = client.simulate_patch("/api/topics")
    assert (r.status_code, r.json) == (405, {"message": "METHOD_NOT_ALLOWED"})
    assert client.simulate_get("/static/nope.js").json == {"message": "NOT_FOUND"}
    assert client.simulate_get("/static/.hidden").json == {"message": "NOT_FOUND"}


def test_go_quote():
    assert go_quote(b'{"message":"X"}') == '"{\\"message\\":\\"X\\"}"'


def test_dev_static_dir_serves_the_ui_from_a_directory(tmp_path):
    (tmp_path / "app.js").write_text("// edited")
    svc = FakeService()
    svc.opts.dev_static_dir = str(tmp_path)
    client = falcon.testing.TestClient(create_app(svc))
    r = client.simulate_get("/static/app.js")
    assert r.text == "// edited" and r.headers["content-type"] == "application/javascript"
    assert client.simulate_get("/static/chart.js").status_code == 404  # only that directory


# ---- upstream over real sockets -----------------------------------------------------------------------------

def test_upstream_error_texts_are_gos(tmp_path):
    import socket as _socket
    import threading
    import time

    from nsqpy.admin.upstream import Upstream

    up = Upstream(connect_timeout=2.0, request_timeout=0.5)
    closed = _socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    with pytest.raises(UpstreamError) as err:
        up.get_json(f"http://127.0.0.1:{port}/stats?format=json")
    assert str(err.value) == (f'Get "http://127.0.0.1:{port}/stats?format=json": dial tcp 127.0.0.1:{port}: '
                              "connect: connection refused")

    def serve(listener, reply, drip=False):
        conn, _ = listener.accept()
        conn.recv(65536)
        if drip:  # a byte at a time, for longer than the request timeout
            try:
                for byte in reply:
                    conn.sendall(bytes([byte]))
                    time.sleep(0.1)  # the stand-in's slowness, not a synchronisation
            except BrokenPipeError:
                pass  # nsqadmin gave up, as it should
        else:
            conn.sendall(reply)
        conn.close()

    for reply, drip, want in (
            (b'HTTP/1.1 404 Not Found\r\nContent-Length: 29\r\n\r\n{"message":"TOPIC_NOT_FOUND"}', False,
             'got response 404 Not Found "{\\"message\\":\\"TOPIC_NOT_FOUND\\"}"'),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" + b" " * 40, True, "context deadline exceeded")):
        listener = _socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        t = threading.Thread(target=serve, args=(listener, reply, drip), daemon=True)
        t.start()
        started = time.monotonic()
        with pytest.raises(UpstreamError) as err:
            up.get_json(f"http://127.0.0.1:{listener.getsockname()[1]}/x")
        assert want in str(err.value)
        if drip:
            assert time.monotonic() - started >= 0.5  # the whole request's deadline, not one read's
        t.join(10)
        listener.close()


def test_upstream_reads_the_body_of_a_reply_that_closes_the_connection():
    """An HTTP/1.0 (or ``Connection: close``) server, such as a graphite behind a plain proxy: http.client closes
    the connection once it has the headers, and the body still has to be read. The server sends the body only
    after the client closed its side, or after a second without that: a client that closes early gets nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    body = b'[{"datapoints": [[125.0, 1]]}]'

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                         % len(body))
            conn.settimeout(1.0)
            try:
                conn.recv(1)  # b"" at once when the client already closed its socket
            except socket.timeout:
                pass
            try:
                conn.sendall(body)
            except OSError:
                pass
    server = threading.Thread(target=serve)
    server.start()
    try:
        assert Upstream(2.0, 10.0).get_json(f"http://127.0.0.1:{listener.getsockname()[1]}/render") == \
            [{"datapoints": [[125.0, 1]]}]
    finally:
        server.join(10)
        listener.close()
