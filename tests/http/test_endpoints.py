"""nsqd's HTTP API over real HTTP against a running nsqd (two workers, gunicorn, port 0): the table of cases.py,
publishes received by a real pynsq consumer, /stats against what TCP clients did on both workers, control
commands seen by live TCP consumers, the JSON field sets of Go nsqd v1.3.0, /metrics, /config, and bad clients.
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nsqpy.protocol import client as C
from tests.broker.test_pynsq import PynsqLoop
from tests.broker.wire import Conn, consumer, producer, unique
from tests.http.cases import CASES, SETUP, check, mpub_binary
from tests.http.conftest import Http, request
from nsqpy.workers.publishing.records import owner_of

DEADLINE = 30.0

# Go nsqd v1.3.0's JSON (nsqd/stats.go, nsqd/http.go doInfo); [master] fields are not in the release
INFO_KEYS = {"version", "broadcast_address", "hostname", "http_port", "tcp_port", "start_time",
             "max_heartbeat_interval", "max_output_buffer_size", "max_output_buffer_timeout", "max_deflate_level"}
STATS_KEYS = {"version", "health", "start_time", "topics", "memory", "producers"}
TOPIC_KEYS = {"topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes", "paused",
              "e2e_processing_latency"}
CHANNEL_KEYS = {"channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
                "requeue_count", "timeout_count", "client_count", "clients", "paused", "e2e_processing_latency"}
CLIENT_KEYS = {"client_id", "hostname", "version", "remote_address", "state", "ready_count", "in_flight_count",
               "message_count", "finish_count", "requeue_count", "connect_ts", "sample_rate", "deflate", "snappy",
               "user_agent", "tls", "tls_cipher_suite", "tls_version", "tls_negotiated_protocol",
               "tls_negotiated_protocol_is_mutual"}
MEMORY_KEYS = {"heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
               "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs"}


@pytest.fixture(scope="module")
def api(http_nsqd):
    addr = http_nsqd.http_address
    for method, path in SETUP:
        assert request(addr, method, path)[0] == 200
    return addr


def stats(api, **params):
    query = "&".join(f"{k}={v}" for k, v in {"format": "json", **params}.items())
    status, headers, body = request(api, "GET", f"/stats?{query}")
    assert status == 200 and headers["content-type"] == "application/json; charset=utf-8"
    return json.loads(body)


def topic_stats(api, topic):
    topics = stats(api, topic=topic)["topics"]
    return topics[0] if topics else None


def until(cond, what, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout} s"
        time.sleep(0.02)  # polling a condition with a deadline


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_row(api, case):
    with Http(api) as h:
        status, headers, body = h.request(case[1], case[2], case[3])
    check(case, status, body, headers)


@pytest.mark.parametrize("path, allow", [("/ping", "GET, OPTIONS"), ("/config/log_level", "GET, OPTIONS, PUT"),
                                         ("/pub?topic=x", "OPTIONS, POST")])
def test_allow_lists_the_routes_methods_as_httprouter(api, path, allow):
    """405 for a method the route does not serve (FOO included) and OPTIONS both list the route's methods and
    OPTIONS, sorted, as nsqd's router (httprouter) does."""
    with Http(api) as h:
        status, headers, body = h.request("FOO", path)
        assert (status, body, headers["allow"]) == (405, b'{"message":"METHOD_NOT_ALLOWED"}', allow)
        status, headers, body = h.request("OPTIONS", path)
        assert (status, body, headers["allow"]) == (200, b"", allow)


def test_http_publishes_reach_a_pynsq_consumer_exactly(api, http_nsqd):
    topic = unique("hp")
    lp = PynsqLoop(http_nsqd.address)
    got = []
    try:
        r = lp.reader(topic, "c", lambda m: got.append(m.body) or True, max_in_flight=100)
        assert request(api, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 404  # the topic must exist
        assert request(api, "POST", f"/topic/create?topic={topic}")[0] == 200
        lp.subscribed(r)
        want = []
        with Http(api) as h:  # one keep-alive connection
            for i in range(20):
                body = b"pub-%d \xff" % i
                assert h.request("POST", f"/pub?topic={topic}", body)[0] == 200
                want.append(body)
            assert h.request("POST", f"/pub?topic={topic}&defer=200", b"deferred")[0] == 200
            want.append(b"deferred")
            lines = [b"line-%d" % i for i in range(30)]
            assert h.request("POST", f"/mpub?topic={topic}", b"\n".join(lines) + b"\n\n")[0] == 200
            want += lines
            blobs = [b"bin\n%d" % i for i in range(10)]
            assert h.request("POST", f"/mpub?topic={topic}&binary=true", mpub_binary(*blobs))[0] == 200
            want += blobs
        lp.run_until(lambda: len(got) >= len(want), what=f"{len(want)} messages")
        until(lambda: (t := topic_stats(api, topic)) and t["channels"][0]["in_flight_count"] == 0
              and t["channels"][0]["depth"] == 0 and t["message_count"] == len(want), "all finished")
        assert sorted(got) == sorted(want)
    finally:
        lp.close()


def _topic_owned_by(worker, prefix):
    while True:
        t = unique(prefix)
        if owner_of(t, 2) == worker:
            return t


def test_stats_agrees_with_tcp_clients_on_both_workers(api, http_nsqd):
    addr = http_nsqd.address
    topics = [_topic_owned_by(0, "sa"), _topic_owned_by(1, "sb")]
    with Conn(addr) as p:
        p.identify(client_id="prod", hostname="prodhost", user_agent="test/1.0")
        p.publish(topics[0], *[b"a%d" % i for i in range(7)])
        p.publish(topics[1], *[b"b%d" % i for i in range(5)])
        holders = [consumer(addr, t, "ch", rdy=3, client_id=f"cons{i}", hostname="h", user_agent="test/1.0")
                   for i, t in enumerate(topics)]
        try:
            for c in holders:
                c.read_messages(3)
            s = stats(api)
            by_name = {t["topic_name"]: t for t in s["topics"]}
            for t, total in zip(topics, (7, 5)):
                ts = by_name[t]
                assert set(ts) >= TOPIC_KEYS and ts["message_count"] == total
                [ch] = ts["channels"]
                assert set(ch) >= CHANNEL_KEYS
                # the first channel took the topic's backlog: all of it was put into the channel (nsqd's count)
                assert (ch["depth"], ch["in_flight_count"], ch["client_count"], ch["message_count"]) == \
                    (total - 3, 3, 1, total)
                [cl] = ch["clients"]
                assert set(cl) >= CLIENT_KEYS and (cl["ready_count"], cl["in_flight_count"]) == (3, 3)
                assert cl["hostname"] == "h" and cl["user_agent"] == "test/1.0"
            [prod] = [c for c in s["producers"] or () if c["client_id"] == "prod"]
            assert set(prod) >= CLIENT_KEYS | {"pub_counts"}
            assert sorted((pc["topic"], pc["count"]) for pc in prod["pub_counts"]) == sorted(zip(topics, (7, 5)))
            assert set(s) == STATS_KEYS and set(s["memory"]) >= MEMORY_KEYS
            text = request(api, "GET", "/stats")[2].decode()
            assert all(f"[{t:<15}]" in text for t in topics) and "[V2 prodhost:" in text
        finally:
            for c in holders:
                c.close()


def test_info_has_the_v1_3_0_fields(api, http_nsqd):
    status, headers, body = request(api, "GET", "/info")
    info = json.loads(body)
    assert status == 200 and set(info) == INFO_KEYS
    assert (info["tcp_port"], info["http_port"], info["version"]) == (http_nsqd.port, api[1], "1.3.0")
    assert info["max_heartbeat_interval"] == 60 * 10**9 and abs(info["start_time"] - time.time()) < 3600


def test_filters_and_include_flags(api, http_nsqd):
    topic = unique("fl")
    producer(http_nsqd.address, topic, b"x")
    for method, path in [("POST", f"/channel/create?topic={topic}&channel=a"),
                         ("POST", f"/channel/create?topic={topic}&channel=b")]:
        assert request(api, method, path)[0] == 200
    s = stats(api, topic=topic, channel="b", include_clients="false", include_mem="0")
    assert "memory" not in s and s["producers"] is None
    assert [c["channel_name"] for c in s["topics"][0]["channels"]] == ["b"]
    assert s["topics"][0]["channels"][0]["clients"] is None
    assert stats(api, topic=unique("none"))["topics"] is None


def test_pause_unpause_empty_delete_seen_by_a_tcp_consumer(api, http_nsqd):
    addr = http_nsqd.address
    topic = unique("pc")
    q = f"topic={topic}&channel=ch"
    with consumer(addr, topic, "ch", rdy=10) as c:
        producer(addr, topic, b"first")
        assert c.read_message().body == b"first"
        assert request(api, "POST", f"/channel/pause?{q}")[0] == 200
        producer(addr, topic, b"while-paused")
        until(lambda: topic_stats(api, topic)["channels"][0]["depth"] == 1, "depth 1 while paused")
        assert topic_stats(api, topic)["channels"][0]["paused"] is True
        assert request(api, "POST", f"/channel/empty?{q}")[0] == 200
        until(lambda: topic_stats(api, topic)["channels"][0]["depth"] == 0, "emptied")
        assert request(api, "POST", f"/channel/unpause?{q}")[0] == 200
        producer(addr, topic, b"after")
        assert c.read_message().body == b"after"  # the emptied message never comes
        assert request(api, "POST", f"/topic/pause?topic={topic}")[0] == 200
        producer(addr, topic, b"topic-paused")
        until(lambda: topic_stats(api, topic)["paused"] is True, "topic paused")
        assert request(api, "POST", f"/topic/unpause?topic={topic}")[0] == 200
        assert c.read_message().body == b"topic-paused"
        assert request(api, "POST", f"/channel/delete?{q}")[0] == 200
        assert c.next_frame() is None  # nsqd closes the channel's consumers
    assert topic_stats(api, topic)["channels"] == []
    with consumer(addr, topic, "other", rdy=1) as c:
        assert request(api, "POST", f"/topic/delete?topic={topic}")[0] == 200
        assert c.next_frame() is None  # the topic's consumers are closed with it
    until(lambda: topic_stats(api, topic) is None, "topic gone")
    assert request(api, "POST", f"/topic/delete?topic={topic}")[0] == 404


def test_topic_empty_clears_what_waits_for_a_first_channel(api, http_nsqd):
    topic = unique("te")
    producer(http_nsqd.address, topic, b"a", b"b", b"c")
    until(lambda: topic_stats(api, topic)["depth"] == 3, "3 messages waiting")
    assert request(api, "POST", f"/topic/empty?topic={topic}")[0] == 200
    until(lambda: topic_stats(api, topic)["depth"] == 0, "emptied")
    with consumer(http_nsqd.address, topic, "c", rdy=5) as c:
        producer(http_nsqd.address, topic, b"new")
        assert c.read_message().body == b"new"  # nothing emptied comes back


def test_metrics_parse_and_match_stats(api, http_nsqd):
    topic = unique("mx")
    producer(http_nsqd.address, topic, b"1", b"2", b"3")
    status, headers, body = request(api, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")

    def samples():
        text = request(api, "GET", "/metrics")[2].decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}
    got = until(lambda: (m := samples()).get(("nsq_topic_messages_total", (("topic", topic),))) == 3 and m,
                "metrics caught up")
    assert got[("nsqpy_process_resident_memory_bytes", (("process", "worker 0"),))] > 0
    assert ("nsqpy_process_restarts_total", (("process", "scanner"),)) in got


def test_config_log_level_and_lookupd(api):
    assert request(api, "PUT", "/config/log_level", b"debug")[2] == b"1"
    assert request(api, "GET", "/config/log_level")[2] == b"1"  # every HTTP worker shares it
    assert request(api, "GET", "/config/log_level")[2] == b"1"
    assert request(api, "PUT", "/config/log_level", b"info")[2] == b"2"
    path = "/config/nsqlookupd_tcp_addresses"
    assert json.loads(request(api, "GET", path)[2]) == []
    assert json.loads(request(api, "PUT", path, b'["127.0.0.1:1", "127.0.0.2:2"]')[2]) == ["127.0.0.1:1",
                                                                                            "127.0.0.2:2"]
    for _ in range(4):  # whichever HTTP worker answers
        assert json.loads(request(api, "GET", path)[2]) == ["127.0.0.1:1", "127.0.0.2:2"]
    assert json.loads(request(api, "PUT", path, b"null")[2]) == []


def test_huge_query_and_trickling_client_do_not_stop_others(api):
    status, _, _ = request(api, "GET", "/stats?topic=" + "a" * 100_000)
    assert 400 <= status < 500
    trickler = socket.create_connection(api)
    stop = threading.Event()

    def trickle():
        trickler.sendall(b"POST /pub?topic=trickle HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
        while not stop.wait(0.05):  # one byte at a time: a slow client, not a test synchronisation
            try:
                trickler.send(b"x")
            except OSError:
                return

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        for _ in range(20):
            assert request(api, "GET", "/ping")[2] == b"OK"
            assert request(api, "POST", f"/pub?topic={unique('tr')}", b"x")[0] == 200
    finally:
        stop.set()
        t.join()
        trickler.close()


def test_non_utf8_and_raw_bytes(api, http_nsqd):
    topic = unique("nu")
    body = bytes(range(256))
    with consumer(http_nsqd.address, topic, "c", rdy=1) as c:
        assert request(api, "POST", f"/pub?topic={topic}", body)[0] == 200
        assert c.read_message().body == body
        c.send(C.nop())
    assert request(api, "POST", f"/pub?topic={topic}%80", b"x")[0] == 400


def test_gunicorn_says_nothing_alarming(http_nsqd, api):
    """Bad requests are the clients' business: gunicorn's lines (DEBUG at nsqd's default level) stay quiet, and
    nothing crashed in a handler."""
    noisy = [line for line in http_nsqd.output().splitlines()
             if "HTTP:" in line and ("WARNING" in line or "ERROR" in line or "FATAL" in line)]
    assert not noisy, noisy
    assert "panic in HTTP handler" not in http_nsqd.output()


def test_stats_under_load_never_runs_ahead_and_ends_exact(api, http_nsqd):
    """While TCP producers publish to a topic on each worker, every /stats count is between what was answered OK
    before the request and what was sent by its end; once they stop, one /stats is exact."""
    addr = http_nsqd.address
    topics = [_topic_owned_by(0, "la"), _topic_owned_by(1, "lb")]
    n = 2000
    acked = {t: 0 for t in topics}

    def produce(topic):
        with Conn(addr) as p:
            for k in range(0, n, 50):
                p.send(b"".join(C.pub(topic, b"%d" % i) for i in range(k, k + 50)))
                for _ in range(50):
                    p.expect_response()
                acked[topic] += 50

    threads = [threading.Thread(target=produce, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    seen = {t: 0 for t in topics}
    while any(t.is_alive() for t in threads):
        floor = dict(acked)
        counts = {t["topic_name"]: t["message_count"] for t in stats(api)["topics"] or () if t["topic_name"] in seen}
        for topic in topics:
            got = counts.get(topic, 0)
            assert floor[topic] <= got <= n and got >= seen[topic], (topic, floor[topic], got, seen[topic])
            seen[topic] = got
    for t in threads:
        t.join()
    final = {t["topic_name"]: (t["message_count"], t["depth"]) for t in stats(api)["topics"] if t["topic_name"] in seen}
    assert final == {t: (n, n) for t in topics}
