"""The pieces without processes: the registration database (NSQ's semantics, wildcards, indexes kept in step),
the HTTP app through falcon.testing over a local database, and the nsqd side's registration diff."""
from __future__ import annotations

import random

from falcon import testing

from nsqpy.http_api.lookupd import create_app
from nsqpy.lookupd.queries import Queries, go_json
from nsqpy.lookupd.registration_db import PeerInfo, Producer, Registration, RegistrationDB, filter_by_active
from nsqpy.workers.processes.lookupd_link import diff, initial_commands, registrations

SECOND = 10**9


def peer(i, last_update=None):
    p = PeerInfo(id=f"10.0.0.{i}:1", remote_address=f"10.0.0.{i}:1", hostname=f"h{i}", broadcast_address=f"b{i}",
                 tcp_port=4150 + i, http_port=4250 + i, version="1.3.0")
    if last_update is not None:
        p.last_update = last_update
    return p


def test_db_semantics_match_nsq():
    db = RegistrationDB()
    a, b = peer(1), peer(2)
    t, c = Registration("topic", "t", ""), Registration("channel", "t", "c")
    assert db.add_producer(t, Producer(a)) and not db.add_producer(t, Producer(a))  # once per peer
    db.add_producer(c, Producer(a))
    db.add_producer(t, Producer(b))
    assert [p.peer for p in db.find_producers("topic", "t", "")] == [a, b]
    assert db.find_registrations("channel", "t", "*") == [c]
    assert db.find_registrations("channel", "*", "*") == [c]
    assert db.find_registrations("topic", "*", "") == [t]
    assert db.lookup_registrations(a.id) == [c, t]
    assert db.remove_producer(c, a.id) == (True, 0) and db.remove_producer(c, a.id) == (False, 0)
    assert c in db.map  # the key stays
    db.remove_registration(t)
    assert db.lookup_registrations(a.id) == [] and db.lookup_registrations(b.id) == []
    assert db.find_producers("topic", "*", "") == []


def test_db_indexes_stay_in_step_with_a_model():
    rnd = random.Random(7)
    db = RegistrationDB()
    peers = [peer(i) for i in range(4)]
    keys = [Registration("topic", f"t{i}", "") for i in range(3)] + \
           [Registration("channel", f"t{i}", f"c{j}") for i in range(3) for j in range(2)]
    for _ in range(2000):
        k, p = rnd.choice(keys), rnd.choice(peers)
        op = rnd.randrange(4)
        if op == 0:
            db.add_producer(k, Producer(p))
        elif op == 1:
            db.remove_producer(k, p.id)
        elif op == 2 and rnd.random() < 0.2:
            db.remove_registration(k)
        else:
            db.add_registration(k)
        for q in peers:  # the by-peer index against a scan
            assert db.lookup_registrations(q.id) == sorted(r for r, ps in db.map.items() if q.id in ps)
        for i in range(3):  # the by-topic channel index against a scan
            assert db.find_registrations("channel", f"t{i}", "*") == sorted(
                r for r in db.map if r.category == "channel" and r.key == f"t{i}")


def test_active_filter_and_tombstones():
    now = 100 * SECOND
    fresh, stale = Producer(peer(1, now - SECOND)), Producer(peer(2, now - 10 * SECOND))
    assert filter_by_active([fresh, stale], 5 * SECOND, 0, now) == [fresh]
    fresh.tombstone(now - SECOND)
    assert filter_by_active([fresh], 5 * SECOND, 2 * SECOND, now) == []
    assert filter_by_active([fresh], 5 * SECOND, SECOND, now) == [fresh]  # lifetime over
    assert filter_by_active([fresh], 5 * SECOND, 0, now) == [fresh]       # /nodes keeps tombstoned ones


def test_go_json_escapes_like_encoding_json():
    assert go_json({"a": "<&>\u2028é"}) == '{"a":"\\u003c\\u0026\\u003e\\u2028é"}'.encode()


def test_app_get_endpoints_through_falcon_testing():
    db = RegistrationDB()
    db.add_producer(Registration("client", "", ""), Producer(peer(1)))
    db.add_producer(Registration("topic", "t", ""), Producer(peer(1)))
    db.add_producer(Registration("channel", "t", "c"), Producer(peer(1)))
    client = testing.TestClient(create_app(Queries(db, 300 * SECOND, 45 * SECOND)))
    r = client.simulate_get("/lookup", query_string="topic=t")
    assert r.status_code == 200 and r.headers["x-nsq-content-type"] == "nsq; version=1.0"
    assert r.json == {"channels": ["c"], "producers": [{"remote_address": "10.0.0.1:1", "hostname": "h1",
                                                        "broadcast_address": "b1", "tcp_port": 4151,
                                                        "http_port": 4251, "version": "1.3.0"}]}
    assert client.simulate_get("/topics").json == {"topics": ["t"]}
    assert client.simulate_get("/nodes").json["producers"][0]["topics"] == ["t"]
    # NSQ's wildcard, kept: '*' matches every topic
    assert client.simulate_get("/channels", query_string="topic=*").json == {"channels": ["c"]}


def test_app_answers_internal_error_when_the_registry_is_unreachable():
    class Down:
        def call(self, op, *args):
            raise ConnectionRefusedError("registry restarting")
    r = testing.TestClient(create_app(Down())).simulate_get("/topics")
    assert (r.status_code, r.content) == (500, b'{"message":"INTERNAL_ERROR"}')


def test_registration_diff_is_what_nsqd_notifies():
    stats = {"topics": [{"topic_name": "a", "channels": []},
                        {"topic_name": "b", "channels": [{"channel_name": "x"}, {"channel_name": "y"}]}]}
    state = registrations(stats)
    assert initial_commands(state) == [b"REGISTER a\n", b"REGISTER b x\n", b"REGISTER b y\n"]
    assert diff({}, state) == [b"REGISTER a\n", b"REGISTER b\n", b"REGISTER b x\n", b"REGISTER b y\n"]
    later = {"b": frozenset({"y", "z"}), "c": frozenset()}
    assert diff(state, later) == [b"REGISTER c\n", b"REGISTER b z\n", b"UNREGISTER b x\n", b"UNREGISTER a\n"]
    assert diff(later, {}) == [b"UNREGISTER b y\n", b"UNREGISTER b z\n", b"UNREGISTER b\n", b"UNREGISTER c\n"]
    assert registrations({"topics": None}) == {}
