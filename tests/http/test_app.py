"""The Falcon app alone (``falcon.testing``): every row of cases.py, and the pure parts (query parsing, text
/stats, statsd lines and packets, the Prometheus exposition).

The app is given a small in-memory broker as its dependencies: these tests are about what nsqd's HTTP layer
checks and answers, which happens before the broker is asked anything. test_endpoints.py runs the same table
against the real broker.
"""
from __future__ import annotations

import falcon.testing
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqpy.http_api.metrics import exposition
from nsqpy.http_api.nsqd_app import NsqdDeps, PublishRefused, create_app
from nsqpy.http_api.query import BadQuery, parse_query
from nsqpy.http_api.stats_text import go_duration, stats_text
from nsqpy.http_api.statsd import packets, statsd_lines, statsd_prefix
from nsqpy.config import NsqdOptions
from tests.http.cases import CASES, SETUP, check


class MemoryBroker:
    """Topics and channels in dicts, publishes in a list: what the app's deps promise, nothing more."""

    def __init__(self):
        self.topics = {}      # name -> {"channels": {name: paused}, "paused": bool, "count": int}
        self.published = []   # (topic, bodies, defer_ms)
        self.level = 2
        self.lookupd = []
        self.refuse = False

    def publish(self, topic, bodies, defer_ms):
        if self.refuse:
            raise PublishRefused("full")
        self.topics.setdefault(topic, {"channels": {}, "paused": False, "count": 0})["count"] += len(bodies)
        self.published.append((topic, list(bodies), defer_ms))

    def command(self, op, topic, channel):
        kind, _, verb = op.partition("_")
        if verb == "create":
            t = self.topics.setdefault(topic, {"channels": {}, "paused": False, "count": 0})
            if kind == "channel":
                t["channels"].setdefault(channel, False)
            return "OK"
        t = self.topics.get(topic)
        if t is None:
            return "TOPIC_NOT_FOUND"
        if kind == "channel" and channel not in t["channels"]:
            return "CHANNEL_NOT_FOUND"
        if verb == "delete":
            del (t["channels"] if kind == "channel" else self.topics)[channel if kind == "channel" else topic]
        elif verb in ("pause", "unpause"):
            if kind == "channel":
                t["channels"][channel] = verb == "pause"
            else:
                t["paused"] = verb == "pause"
        return "OK"

    def stats(self, topic="", channel="", include_clients=True, include_mem=True, **kw):
        topics = [{"topic_name": n, "channels": [_channel(c, p) for c, p in sorted(t["channels"].items())
                                                 if not channel or c == channel],
                   "depth": 0, "backend_depth": 0, "message_count": t["count"], "message_bytes": 0,
                   "paused": t["paused"], "e2e_processing_latency": {"count": 0, "percentiles": None}}
                  for n, t in sorted(self.topics.items()) if not topic or n == topic]
        out = {"version": "1.3.0", "health": "OK", "start_time": 1700000000, "topics": topics or None}
        if include_mem:
            out["memory"] = {"heap_objects": 0, "gc_total_runs": 3}
        out["producers"] = None
        return out

    def deps(self):
        return NsqdDeps(opts=NsqdOptions(), stats=self.stats, publish=self.publish, command=self.command,
                        info={"version": "1.3.0"}, get_log_level=lambda: self.level,
                        set_log_level=lambda v: setattr(self, "level", v), get_lookupd=lambda: self.lookupd,
                        set_lookupd=lambda a: setattr(self, "lookupd", a), metrics=lambda: b"# nothing\n")


def _channel(name, paused):
    return {"channel_name": name, "depth": 0, "backend_depth": 0, "in_flight_count": 0, "deferred_count": 0,
            "message_count": 0, "requeue_count": 0, "timeout_count": 0, "client_count": 0, "clients": [],
            "paused": paused, "e2e_processing_latency": {"count": 0, "percentiles": None}}


@pytest.fixture
def broker():
    return MemoryBroker()


@pytest.fixture(params=["wsgi", "asgi"])
def client(broker, request):
    """The app as gunicorn's sync/gthread workers run it, and as its asgi worker does."""
    c = falcon.testing.TestClient(create_app(broker.deps(), asgi=request.param == "asgi"))
    for method, path in SETUP:
        assert simulate(c, method, path).status_code == 200
    return c


def simulate(client, method, path, body=b""):
    path, _, query = path.partition("?")
    return client.simulate_request(method, path, query_string=query or None, body=body)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_row(client, case):
    r = simulate(client, case[1], case[2], case[3])
    check(case, r.status_code, r.content, {k.lower(): v for k, v in r.headers.items()})


def test_publishes_reach_the_broker_as_given(client, broker):
    simulate(client, "POST", "/pub?topic=t&defer=250", b"one")
    simulate(client, "POST", "/mpub?topic=t", b"a\n\nb\r\n")
    simulate(client, "POST", "/mpub?topic=t&binary=true", b"\0\0\0\2\0\0\0\1x\0\0\0\2y\n")
    assert broker.published == [("t", [b"one"], 250), ("t", [b"a", b"b\r"], 0), ("t", [b"x", b"y\n"], 0)]


def test_a_refused_publish_is_503_exiting(client, broker):
    broker.refuse = True
    r = simulate(client, "POST", "/pub?topic=t", b"x")
    assert (r.status_code, r.json) == (503, {"message": "EXITING"})


def test_config_put_answers_the_new_value(client, broker):
    r = simulate(client, "PUT", "/config/log_level", b"DEBUG")
    assert (r.status_code, r.json, broker.level) == (200, 1, 1)
    r = simulate(client, "PUT", "/config/nsqlookupd_tcp_addresses", b'["a:4160","b:4160"]')
    assert (r.status_code, r.json) == (200, ["a:4160", "b:4160"])
    assert simulate(client, "GET", "/config/nsqlookupd_tcp_addresses").json == ["a:4160", "b:4160"]


def test_unhealthy_ping_and_stats():
    b = MemoryBroker()
    deps = b.deps()
    deps.health = lambda: "disk full"
    c = falcon.testing.TestClient(create_app(deps))
    r = c.simulate_get("/ping")
    assert (r.status_code, r.text) == (500, "NOK - disk full")
    assert c.simulate_get("/stats", query_string="format=json").json["health"] == "NOK - disk full"


def test_a_crash_in_a_handler_is_500_internal_error():
    b = MemoryBroker()
    deps = b.deps()
    deps.stats = lambda **kw: 1 / 0
    r = falcon.testing.TestClient(create_app(deps)).simulate_get("/stats")
    assert (r.status_code, r.json) == (500, {"message": "INTERNAL_ERROR"})


def test_stats_filters_and_booleans(client, broker):
    j = simulate(client, "GET", "/stats?format=json&include_mem=0&include_clients=false").json
    assert "memory" not in j
    assert "memory" in simulate(client, "GET", "/stats?format=json&include_mem=maybe").json  # unknown: default
    text = simulate(client, "GET", "/stats").text  # anything but format=json is text
    assert text.startswith("nsqd v1.3.0\nstart_time ") and "\nTopics:" in text


@pytest.mark.parametrize("raw, parsed", [
    ("a=1&b=2&a=3", {"a": ["1", "3"], "b": ["2"]}), ("a", {"a": [""]}), ("a=x+y%20z", {"a": ["x y z"]}),
    ("&&a=1&", {"a": ["1"]}), ("t=%FF", {"t": ["\udcff"]}),
])
def test_query_like_go(raw, parsed):
    assert parse_query(raw) == parsed


@pytest.mark.parametrize("raw", ["a=%", "a=%4", "a=%zz", "a=1;b=2"])
def test_query_errors_like_go(raw):
    with pytest.raises(BadQuery):
        parse_query(raw)


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (1.5, "1.5s"), (60, "1m0s"), (3723.25, "1h2m3.25s"),
                                           (0.0042, "4.2ms"), (90e-6, "90µs")])
def test_go_durations(seconds, text):
    assert go_duration(seconds) == text


def test_text_stats_lines():
    stats = {"version": "1.3.0", "health": "OK", "start_time": 0, "producers": None, "topics": [
        {"topic_name": "t", "depth": 1, "backend_depth": 0, "message_count": 5, "paused": True,
         "e2e_processing_latency": {"count": 0, "percentiles": None}, "channels": [
             {"channel_name": "c", "depth": 2, "backend_depth": 0, "in_flight_count": 1, "deferred_count": 0,
              "requeue_count": 0, "timeout_count": 0, "message_count": 3, "paused": False, "clients": [
                  {"version": "V2", "hostname": "h", "remote_address": "1.2.3.4:5", "user_agent": "ua", "state": 3,
                   "in_flight_count": 1, "ready_count": 2, "finish_count": 3, "requeue_count": 0,
                   "message_count": 4, "connect_ts": 0}]}]}]}
    text = stats_text(stats, "nsqd v1.3.0", now=10)
    assert "\n*P [t              ] depth: 1     be-depth: 0     msgs: 5        e2e%: \n" in text
    assert "      [c                        ] depth: 2     be-depth: 0     inflt: 1    def: 0    re-q: 0     " \
           "timeout: 0     msgs: 3        e2e%: \n" in text
    assert "        [V2 h:5 ua               ] state: 3 inflt: 1    rdy: 2    fin: 3        re-q: 0        " \
           "msgs: 4        connected: 10s\n" in text
    assert text.endswith("\nProducers: None\n")


def test_statsd_names_deltas_and_packets():
    assert statsd_prefix("nsq.%s", "host.example", 4151) == "nsq.host_example_4151."
    assert statsd_prefix("nsq.", "h", 1) == "nsq."
    chan = dict(_channel("c", False), message_count=7, depth=2, client_count=1)
    now = {"topics": [{"topic_name": "t", "message_count": 10, "message_bytes": 100, "depth": 1,
                       "backend_depth": 0, "channels": [chan]},
                      {"topic_name": "e#ephemeral", "message_count": 1, "message_bytes": 1, "depth": 0,
                       "backend_depth": 0, "channels": []}],
           "memory": {"heap_in_use_bytes": 5, "gc_total_runs": 9}}
    last = {"topics": [{"topic_name": "t", "message_count": 4, "message_bytes": 40, "channels": [
        dict(chan, message_count=5)]}]}
    lines = statsd_lines(now, last, "p.", exclude_ephemeral=True, mem=True, last_gc_runs=2)
    assert lines[:4] == ["p.topic.t.message_count:6|c", "p.topic.t.message_bytes:60|c", "p.topic.t.depth:1|g",
                         "p.topic.t.backend_depth:0|g"]
    assert "p.topic.t.channel.c.message_count:2|c" in lines and "p.topic.t.channel.c.clients:1|g" in lines
    assert "p.mem.heap_in_use_bytes:5|g" in lines and lines[-1] == "p.mem.gc_runs:7|c"
    assert not any("ephemeral" in line for line in lines)
    datagrams = packets(lines, 60)
    assert b"".join(datagrams).decode().splitlines() == lines
    assert all(len(d) <= 60 for d in datagrams) and all(d.endswith(b"\n") for d in datagrams)


def test_metrics_exposition_parses():
    b = MemoryBroker()
    b.command("channel_create", "t", "c")
    b.publish("t", [b"x", b"y"], 0)
    stats = b.stats()
    stats["memory"]["nsqpy_workers"] = [{"in_flight": 1, "channels_held_by_full_table": 0}]
    text = exposition(stats, {"processes": {"me": __import__("os").getpid()}, "restarts": {"worker 0": 2},
                              "topics_full": [0]}).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    [sample] = families["nsq_topic_messages"].samples
    assert (sample.labels, sample.value) == ({"topic": "t"}, 2)
    assert families["nsqpy_process_restarts"].samples[0].value == 2
    assert families["nsqpy_process_resident_memory_bytes"].samples[0].value > 0
    assert {s.labels["channel"] for s in families["nsq_channel_depth"].samples} == {"c"}
