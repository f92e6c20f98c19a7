"""nsqadmin shows nsqpy's policies (issue 49) of a channel: per node the counters and the effective policy, the
total adding the counters up; a channel without a policy on any node keeps Go nsqadmin's fields exactly. Real
cluster (two nsqpy nsqd, one nsqlookupd), real HTTP; the browser page is tests/admin/test_browser.py's kind of
test and reads these same fields."""
from __future__ import annotations

import json

import pytest

from nsqpy.admin.aggregate import ChannelTotal, channel_row
from nsqpy.protocol import client as C
from tests.admin.admin_wire import eventually, http_name, node_channel, on_lookupd, q, request
from tests.broker.wire import consumer, producer, unique

CHANNEL_FIELDS = ["node", "hostname", "topic_name", "channel_name", "depth", "memory_depth", "backend_depth",
                  "in_flight_count", "deferred_count", "requeue_count", "timeout_count", "message_count",
                  "client_count", "nodes", "clients", "paused", "e2e_processing_latency"]
POLICY_FIELDS = ["dead_lettered_count", "expired_count", "dropped_count"]


@pytest.fixture(scope="module")
def admin(cluster, admin_factory):
    return admin_factory(f"--lookupd-http-address={cluster.lookupd.http}")


def configure(nsqd, topic, channel, doc):
    status, _, body = request(nsqd.http_address, "POST", f"/channel/config?topic={q(topic)}&channel={channel}",
                              json.dumps(doc).encode())
    assert status == 200, body


def test_channel_shows_policies_per_node_and_summed(cluster, admin):
    n1, n2 = cluster.nodes
    topic = unique("apol")
    configure(n1, topic, "ch", {"max_attempts": 1})     # node 1 only: a max attempts of 1
    producer(n1.address, topic, b"a", b"b")
    producer(n2.address, topic, b"c")
    with consumer(n1.address, topic, "ch", rdy=1) as c:
        m = c.read_message()
        c.send(C.req(m.id, 0))        # at its max attempts: dead-lettered on node 1
        c.send(C.fin(c.read_message().id))
        eventually(lambda: (node_channel(n1, topic, "ch") or {}).get("dead_lettered_count") == 1
                   and node_channel(n1, topic, "ch")["in_flight_count"] == 0, what="the dead letter on node 1")
    consumer(n2.address, topic, "ch").close()
    on_lookupd(cluster, topic, 2)
    doc = admin.get(f"/api/topics/{q(topic)}/ch")
    assert list(doc) == CHANNEL_FIELDS + POLICY_FIELDS + ["policy", "message"]
    assert [doc[k] for k in POLICY_FIELDS] == [1, 0, 0]
    assert doc["policy"]["max_attempts"] == 1 and doc["policy"]["dead_letter_topic"] == f"{topic}.dead"
    rows = {r["node"]: r for r in doc["nodes"]}
    one, two = rows[http_name(n1)], rows[http_name(n2)]
    assert list(one) == CHANNEL_FIELDS + POLICY_FIELDS + ["policy"] and one["dead_lettered_count"] == 1
    assert list(two) == CHANNEL_FIELDS   # node 2 has no policy for it: Go nsqd's fields only
    # the topic page's channel row is the same total
    [ch] = [c for c in admin.get(f"/api/topics/{q(topic)}")["channels"] if c["channel_name"] == "ch"]
    assert ch["dead_lettered_count"] == 1 and ch["policy"] == doc["policy"]
    status, _, body = admin.request("GET", "/metrics")
    assert status == 200
    assert f'nsqadmin_channel_dead_lettered_total{{channel="ch",topic="{topic}"}} 1.0' in body.decode()


def test_a_channel_without_policies_keeps_go_nsqadmins_fields(cluster, admin):
    n1, n2 = cluster.nodes
    topic = unique("aplain")
    producer(n1.address, topic, b"a")
    producer(n2.address, topic, b"b")
    consumer(n1.address, topic, "ch").close()
    consumer(n2.address, topic, "ch").close()
    on_lookupd(cluster, topic, 2)
    doc = admin.get(f"/api/topics/{q(topic)}/ch")
    assert list(doc) == CHANNEL_FIELDS + ["message"]
    assert all(list(r) == CHANNEL_FIELDS for r in doc["nodes"])


def test_totals_add_the_counters_of_the_nodes_that_have_them():
    raw = {"channel_name": "c", "depth": 3, "backend_depth": 1, "dead_lettered_count": 2, "expired_count": 1,
           "dropped_count": 4, "policy": {"max_attempts": 3, "dead_letter_topic": "t.dead", "message_ttl_ms": 0,
                                          "max_depth": 0, "max_bytes": 0, "overflow": "block"}}
    plain = {"channel_name": "c", "depth": 1, "backend_depth": 0}
    rows = [channel_row(raw, "t", "a:1", "a", 0), channel_row(dict(raw, policy=None, dropped_count=1), "t", "b:1",
                                                               "b", 0), channel_row(plain, "t", "c:1", "c", 0)]
    assert "policy" not in rows[1] and "dropped_count" not in rows[2]
    total = ChannelTotal("t", "c")
    for r in rows:
        total.add(r)
    t = total.row
    assert (t["depth"], t["dead_lettered_count"], t["expired_count"], t["dropped_count"]) == (7, 4, 2, 5)
    assert t["policy"] == raw["policy"]
