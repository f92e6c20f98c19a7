"""Policies over nsqd's HTTP API (issue 49), on a real broker: POST and GET /topic/config and /channel/config (the
effective values, fallback channel < topic < flags, null removal), bad requests as nsqd's 400s, concurrent writers,
the owner applying a config to its channels (seen in /stats), the policy file across a clean restart, a worker
SIGKILL and a whole-broker SIGKILL, and the stats surfaces (/stats JSON and text, /metrics) with and without
policies."""
from __future__ import annotations

import json
import threading

import pytest

from nsqpy.protocol import client as C
from tests.broker.namespaces import kill_workers
from tests.broker.wire import consumer, unique
from tests.http.conftest import Http, request
from tests.polling import wait_until

# what nsqd 1.3.0's /stats shows of a channel (and nsqpy with no policy): nothing more, nothing less
NSQ_CHANNEL_KEYS = {"channel_name", "depth", "backend_depth", "in_flight_count", "deferred_count", "message_count",
                    "requeue_count", "timeout_count", "client_count", "clients", "paused", "e2e_processing_latency"}
NSQ_TOPIC_KEYS = {"topic_name", "channels", "depth", "backend_depth", "message_count", "message_bytes", "paused",
                  "e2e_processing_latency"}
POLICY_KEYS = {"dead_lettered_count", "expired_count", "dropped_count", "policy"}
OFF = {"max_attempts": 0, "dead_letter_topic": "", "message_ttl_ms": 0, "max_depth": 0, "max_bytes": 0,
       "overflow": "block"}


def no_errors(n):
    """The broker logged no ERROR (a stats publication that raised is retried, so only its line tells)."""
    errors = [line for line in n.output().splitlines() if "ERROR" in line]
    assert not errors, errors


def call(api, method, path, doc=None):
    body = b"" if doc is None else (doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    status, headers, data = request(api, method, path, body)
    return status, (json.loads(data) if data and headers.get("content-type", "").startswith("application/json")
                    else data)


def ok(api, method, path, doc=None):
    status, out = call(api, method, path, doc)
    assert status == 200, (status, out)
    return out


def channel_stats(api, topic, channel):
    s = ok(api, "GET", f"/stats?format=json&topic={topic}&channel={channel}")
    [t] = s["topics"]
    [c] = t["channels"]
    return c


def create_channel(api, topic, channel):
    ok(api, "POST", f"/topic/create?topic={topic}")
    ok(api, "POST", f"/channel/create?topic={topic}&channel={channel}")


@pytest.fixture(scope="module")
def broker(module_nsqd_factory):
    """Flags set a default (max attempts 5) so that the fallback to them shows; gthread: threads in a worker."""
    return module_nsqd_factory("--max-attempts=5", "--http-worker-class=gthread")


@pytest.fixture(scope="module")
def api(broker):
    return broker.http_address


def test_topic_config_post_then_get(api):
    t = unique("pt")
    got = ok(api, "GET", f"/topic/config?topic={t}")
    assert got == {"topic": t, "effective": dict(OFF, max_attempts=5, dead_letter_topic=f"{t}.dead"), "config": {},
                   "channel_configs": {}, "defaults": {"max_attempts": 5}}
    out = ok(api, "POST", f"/topic/config?topic={t}", {"message_ttl_ms": 60000, "max_attempts": 2})
    assert out["effective"] == dict(OFF, max_attempts=2, dead_letter_topic=f"{t}.dead", message_ttl_ms=60000)
    assert out["config"] == {"message_ttl_ms": 60000, "max_attempts": 2}
    assert ok(api, "GET", f"/topic/config?topic={t}") == out
    # null removes a field: max_attempts falls back to the flag's 5
    out = ok(api, "POST", f"/topic/config?topic={t}", {"max_attempts": None})
    assert out["config"] == {"message_ttl_ms": 60000}
    assert out["effective"]["max_attempts"] == 5
    # an empty body (or {}) changes nothing and answers the same
    assert ok(api, "POST", f"/topic/config?topic={t}") == out
    assert ok(api, "POST", f"/topic/config?topic={t}", {}) == out


def test_channel_config_falls_back_to_topic_then_flags(api):
    t = unique("pc")
    ok(api, "POST", f"/topic/config?topic={t}", {"max_depth": 100, "overflow": "reject"})
    out = ok(api, "POST", f"/channel/config?topic={t}&channel=c", {"max_depth": 10, "dead_letter_topic": "dlq"})
    assert out["effective"] == dict(OFF, max_attempts=5, dead_letter_topic="dlq", max_depth=10, overflow="reject")
    assert out["config"] == {"max_depth": 10, "dead_letter_topic": "dlq"}
    assert out["topic_config"] == {"max_depth": 100, "overflow": "reject"}
    other = ok(api, "GET", f"/channel/config?topic={t}&channel=other")
    assert other["effective"] == dict(OFF, max_attempts=5, dead_letter_topic=f"{t}.dead", max_depth=100,
                                      overflow="reject")
    assert ok(api, "GET", f"/topic/config?topic={t}")["channel_configs"] == {"c": {"max_depth": 10,
                                                                                    "dead_letter_topic": "dlq"}}
    out = ok(api, "POST", f"/channel/config?topic={t}&channel=c", {"max_depth": None, "dead_letter_topic": None})
    assert out["config"] == {} and out["effective"] == other["effective"]
    assert ok(api, "GET", f"/topic/config?topic={t}")["channel_configs"] == {}
    # the dead-letter topic does not take the flags' defaults
    dead = ok(api, "GET", f"/channel/config?topic={t}.dead&channel=c")
    assert dead["effective"] == OFF


@pytest.mark.parametrize("path, body, code", [
    ("/topic/config", b"{}", "MISSING_ARG_TOPIC"),
    ("/topic/config?topic=a%20b", b"{}", "INVALID_TOPIC"),
    ("/channel/config?channel=c", b"{}", "MISSING_ARG_TOPIC"),
    ("/channel/config?topic=a%20b&channel=c", b"{}", "INVALID_ARG_TOPIC"),
    ("/channel/config?topic=bad_body", b"{}", "MISSING_ARG_CHANNEL"),
    ("/channel/config?topic=bad_body&channel=!", b"{}", "INVALID_ARG_CHANNEL"),
    ("/topic/config?topic=bad_body", b"{not json", "INVALID_BODY"),
    ("/topic/config?topic=bad_body", b"[1]", "INVALID_BODY"),
    ("/topic/config?topic=bad_body", b'{"ttl": 5}', "INVALID_FIELD"),
    ("/topic/config?topic=bad_body", b'{"max_attempts": -1}', "INVALID_VALUE"),
    ("/topic/config?topic=bad_body", b'{"max_attempts": 70000}', "INVALID_VALUE"),
    ("/topic/config?topic=bad_body", b'{"max_bytes": "1M"}', "INVALID_VALUE"),
    ("/channel/config?topic=bad_body&channel=c", b'{"overflow": "spill"}', "INVALID_VALUE"),
    ("/channel/config?topic=bad_body&channel=c", b'{"dead_letter_topic": "x y"}', "INVALID_VALUE"),
])
def test_bad_requests_are_nsq_style_400s(api, path, body, code):
    status, headers, data = request(api, "POST", path, body)
    assert (status, data) == (400, json.dumps({"message": code}, separators=(",", ":")).encode())
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert ok(api, "GET", "/topic/config?topic=bad_body")["config"] == {}   # nothing was stored


def test_other_methods_are_405(api):
    for path in ("/topic/config?topic=x", "/channel/config?topic=x&channel=y"):
        status, headers, data = request(api, "PUT", path, b"{}")
        assert (status, data) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
        assert headers["allow"] == "GET, OPTIONS, POST"


def test_concurrent_posts_lose_nothing(api, broker):
    """Threads on their own connections (both gunicorn workers, and the threads of each) configure topics and
    channels at once: every config is in the file and answered by GET."""
    base = unique("cc")
    errors = []

    def writer(k):
        try:
            with Http(api) as h:
                for i in range(6):
                    status, _, data = h.request("POST", f"/topic/config?topic={base}_{k}",
                                                json.dumps({"max_depth": i + 1}).encode())
                    assert status == 200, data
                    status, _, data = h.request("POST", f"/channel/config?topic={base}&channel=c{k}_{i}",
                                                json.dumps({"max_bytes": 1000 * k + i + 1}).encode())
                    assert status == 200, data
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    with open(f"{broker.data_path}/nsqpy-policies.json") as f:
        doc = json.load(f)
    for k in range(6):
        assert doc["topics"][f"{base}_{k}"] == {"max_depth": 6}
        assert ok(api, "GET", f"/topic/config?topic={base}_{k}")["config"] == {"max_depth": 6}
        for i in range(6):
            assert doc["channels"][base][f"c{k}_{i}"] == {"max_bytes": 1000 * k + i + 1}


def test_the_owner_applies_configs_to_its_channels(api, broker):
    t = unique("own")
    # configured before the topic exists: stored, and the channels get it when they are made
    ok(api, "POST", f"/topic/config?topic={t}", {"max_attempts": 3})
    ok(api, "POST", f"/channel/config?topic={t}&channel=ttl", {"message_ttl_ms": 1500})
    create_channel(api, t, "plain")
    create_channel(api, t, "ttl")
    c = channel_stats(api, t, "plain")
    assert set(c) == NSQ_CHANNEL_KEYS | POLICY_KEYS
    assert c["policy"] == dict(OFF, max_attempts=3, dead_letter_topic=f"{t}.dead")
    assert (c["dead_lettered_count"], c["expired_count"], c["dropped_count"]) == (0, 0, 0)
    assert channel_stats(api, t, "ttl")["policy"] == dict(OFF, max_attempts=3, dead_letter_topic=f"{t}.dead",
                                                          message_ttl_ms=1500)
    # a change of the topic's config reaches every channel of it before the POST's reply
    ok(api, "POST", f"/topic/config?topic={t}", {"max_attempts": 7, "dead_letter_topic": "graves"})
    assert channel_stats(api, t, "plain")["policy"] == dict(OFF, max_attempts=7, dead_letter_topic="graves")
    assert channel_stats(api, t, "ttl")["policy"]["max_attempts"] == 7
    # a new dead-letter name is a new stats row: an unfiltered snapshot (the readers' incremental path, in each
    # gunicorn worker) shows it, however the rows' generations line up
    for name in ("graves2", "graves3", "graves"):
        with Http(api) as h:
            for _ in range(2):
                h.request("GET", "/stats?format=json")   # the reader's cache holds the channel's last dict
            status, _, data = h.request("POST", f"/topic/config?topic={t}", json.dumps({"dead_letter_topic": name}).encode())
            assert status == 200, data
            status, _, data = h.request("GET", "/stats?format=json")
        [c] = [c for tt in json.loads(data)["topics"] if tt["topic_name"] == t for c in tt["channels"]
               if c["channel_name"] == "plain"]
        assert c["policy"]["dead_letter_topic"] == name
    # a channel's own change reaches that channel
    ok(api, "POST", f"/channel/config?topic={t}&channel=plain", {"max_depth": 50, "overflow": "drop_oldest"})
    assert channel_stats(api, t, "plain")["policy"] == dict(OFF, max_attempts=7, dead_letter_topic="graves",
                                                            max_depth=50, overflow="drop_oldest")
    # and a consumer's channel (made by SUB) gets its policy too
    with consumer(broker.address, t, "sub", rdy=1):
        assert channel_stats(api, t, "sub")["policy"]["max_attempts"] == 7
    no_errors(broker)


def test_stats_text_and_metrics_show_policies(api):
    t = unique("surf")
    ok(api, "POST", f"/channel/config?topic={t}&channel=c", {"max_attempts": 2, "message_ttl_ms": 90000,
                                                           "max_depth": 9})
    create_channel(api, t, "c")
    create_channel(api, t, "d")
    status, _, text = request(api, "GET", f"/stats?topic={t}")
    assert status == 200
    lines = text.decode().splitlines()
    [i] = [k for k, ln in enumerate(lines) if ln.strip().startswith("[c ")]
    assert lines[i + 1].split() == ["policy:", "dead-lettered:", "0", "expired:", "0", "dropped:", "0",
                                    "max-attempts=2", f"dead-letter={t}.dead", "ttl=1m30s", "max-depth=9",
                                    "overflow=block"]
    # a channel with the flags' default policy shows it too
    [j] = [k for k, ln in enumerate(lines) if ln.strip().startswith("[d ")]
    assert lines[j + 1].split()[-2:] == ["max-attempts=5", f"dead-letter={t}.dead"]
    status, _, metrics = request(api, "GET", "/metrics")
    assert status == 200
    m = metrics.decode()
    label = f'channel="c",topic="{t}"'
    for line in (f"nsqpy_channel_dead_lettered_total{{{label}}} 0.0", f"nsqpy_channel_expired_total{{{label}}} 0.0",
                 f"nsqpy_channel_dropped_total{{{label}}} 0.0", f"nsqpy_channel_policy_max_attempts{{{label}}} 2.0",
                 f"nsqpy_channel_policy_message_ttl_seconds{{{label}}} 90.0",
                 f"nsqpy_channel_policy_max_depth{{{label}}} 9.0"):
        assert line in m, (line, [x for x in m.splitlines() if t in x and "nsqpy" in x])


def test_without_policies_stats_are_nsqs(module_nsqd_factory):
    """A broker no one configured: /stats JSON has NSQ's field set for topics and channels, the text no policy
    line, /metrics no policy sample."""
    n = module_nsqd_factory()
    api = n.http_address
    t = unique("plain")
    create_channel(api, t, "c")
    with consumer(n.address, t, "sub", rdy=1):
        s = ok(api, "GET", "/stats?format=json")
        for topic in s["topics"]:
            assert set(topic) == NSQ_TOPIC_KEYS
            for c in topic["channels"]:
                assert set(c) == NSQ_CHANNEL_KEYS
        status, _, text = request(api, "GET", "/stats")
        assert b"policy:" not in text
        status, _, metrics = request(api, "GET", "/metrics")
        assert not [ln for ln in metrics.decode().splitlines() if ln.startswith("nsqpy_channel") and t in ln]
        assert ok(api, "GET", f"/channel/config?topic={t}&channel=c")["effective"] == OFF
    no_errors(n)


def test_policies_survive_restart_and_crashes(nsqd_factory):
    n = nsqd_factory()
    api = n.http_address
    t = unique("keep")
    ok(api, "POST", f"/topic/config?topic={t}", {"max_attempts": 4})
    ok(api, "POST", f"/channel/config?topic={t}&channel=c", {"message_ttl_ms": 3000})
    create_channel(api, t, "c")
    want = dict(OFF, max_attempts=4, dead_letter_topic=f"{t}.dead", message_ttl_ms=3000)
    assert channel_stats(api, t, "c")["policy"] == want

    # a clean stop, then a start on the same data path: the channel comes back from nsqd.dat with its policy
    assert n.stop() == 0
    n = nsqd_factory(data=n.data_path)
    api = n.http_address
    assert channel_stats(api, t, "c")["policy"] == want
    assert ok(api, "GET", f"/channel/config?topic={t}&channel=c")["effective"] == want

    # a worker SIGKILL: the replacement reads the file and sets the recovered channel's policy
    kill_workers(n)
    wait_until(lambda: channel_stats(api, t, "c").get("policy") == want, what="the recovered channel's policy")
    # a change after the kill reaches the replacement
    ok(api, "POST", f"/channel/config?topic={t}&channel=c", {"max_depth": 11})
    want = dict(want, max_depth=11)
    assert channel_stats(api, t, "c")["policy"] == want

    # the whole broker SIGKILLed: the next start salvages the channel, and its policy is in the file
    n.kill_all()
    n = nsqd_factory(data=n.data_path)
    api = n.http_address
    assert channel_stats(api, t, "c")["policy"] == want


def test_counters_reach_every_surface(api, broker):
    """What the policies did (engineer B's dead letters, C's drop_oldest) shows in /stats JSON and text and in
    /metrics: a message REQ'd at its max attempts is dead-lettered; a channel over its max depth drops its
    oldest."""
    t = unique("cnt")
    ok(api, "POST", f"/channel/config?topic={t}&channel=dl", {"max_attempts": 1})
    ok(api, "POST", f"/channel/config?topic={t}&channel=drop", {"max_depth": 2, "overflow": "drop_oldest"})
    create_channel(api, t, "dl")
    create_channel(api, t, "drop")
    with consumer(broker.address, t, "dl", rdy=1) as c:
        for body in (b"m1", b"m2", b"m3"):
            status, _, data = request(api, "POST", f"/pub?topic={t}", body)
            assert status == 200, data
        m = c.read_message()
        c.send(C.req(m.id, 0))   # its first delivery was its last: dead-lettered, not delivered again
        for _ in range(2):       # the others are finished (one left in flight would be dead-lettered at the close)
            c.send(C.fin(c.read_message().id))
        wait_until(lambda: (lambda c: (c["dead_lettered_count"], c["in_flight_count"], c["depth"]) == (1, 0, 0))(
            channel_stats(api, t, "dl")), what="the dead letter counted, the others finished")
    drop = channel_stats(api, t, "drop")
    assert (drop["depth"], drop["dropped_count"]) == (2, 1)
    dead = ok(api, "GET", f"/stats?format=json&topic={t}.dead")["topics"]
    assert dead and dead[0]["message_count"] == 1
    status, _, text = request(api, "GET", f"/stats?topic={t}")
    assert "policy: dead-lettered: 1 " in " ".join(text.decode().split()) + " "
    status, _, metrics = request(api, "GET", "/metrics")
    m = metrics.decode()
    assert f'nsqpy_channel_dead_lettered_total{{channel="dl",topic="{t}"}} 1.0' in m
    assert f'nsqpy_channel_dropped_total{{channel="drop",topic="{t}"}} 1.0' in m
