"""AUTH against a real auth server (tests/tls/authserver.py): allow, deny, partial permissions, TTL expiry and a
second query, a server that is down or slow, POST requests, and the identity in /stats (spec 10.2)."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from nsqpy.protocol import client as C
from tests.broker.wire import Conn, unique
from tests.tls.authserver import AuthServer

ALL = [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}]


@pytest.fixture(scope="module")
def auth():
    server = AuthServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def broker(module_nsqd_factory, auth):
    return module_nsqd_factory(f"--auth-http-address={auth.address}")


def authed(broker, secret, **identify):
    c = Conn(broker.address)
    reply = c.identify(feature_negotiation=True, **identify)
    assert reply["auth_required"] is True
    c.send(C.auth(secret))
    return c


def stats(broker):
    host, port = broker.http_address
    h = http.client.HTTPConnection(host, port, timeout=60)
    h.request("GET", "/stats?format=json")
    return json.loads(h.getresponse().read())


def test_allow_everything(broker, auth):
    auth.allow("s-all", ALL, identity="alice", identity_url="http://id/alice")
    c = authed(broker, b"s-all", client_id="alice-client")
    assert json.loads(c.expect_frame()[1]) == {"identity": "alice", "identity_url": "http://id/alice",
                                               "permission_count": 1}
    topic = unique("auth")
    c.publish(topic, b"hello")
    c2 = authed(broker, b"s-all")
    c2.expect_frame()
    c2.subscribe(topic, "ch", rdy=1)
    assert c2.read_message().body == b"hello"
    method, params, headers = auth.requests_for("s-all")[0]
    assert method == "GET" and params["remote_ip"] == "127.0.0.1" and params["tls"] == "false"
    assert params["common_name"] == "" and headers.get("ACCEPT") == "application/vnd.nsq; version=1.0"
    deadline = time.monotonic() + 30
    while True:  # the stats plane publishes within ~100 ms of a change
        clients = [cl for t in stats(broker)["topics"] or [] if t["topic_name"] == topic
                   for ch in t["channels"] for cl in ch["clients"]]
        if clients or time.monotonic() > deadline:
            break
    assert clients and clients[0]["authed"] is True and clients[0]["auth_identity"] == "alice"
    assert clients[0]["auth_identity_url"] == "http://id/alice"
    c.close()
    c2.close()


def test_commands_before_auth(broker):
    for cmd, verb in ((C.pub("t", b"x"), "PUB"), (C.sub("t", "c"), "SUB"), (C.mpub("t", [b"x"]), "MPUB"),
                      (C.dpub("t", 10, b"x"), "DPUB")):
        with Conn(broker.address) as c:
            c.send(cmd)
            c.expect_fatal("E_AUTH_FIRST", f"E_AUTH_FIRST AUTH required before {verb}")


def test_no_authorizations(broker, auth):
    auth.allow("s-none", [])
    c = authed(broker, b"s-none")
    c.expect_fatal("E_UNAUTHORIZED", "E_UNAUTHORIZED AUTH no authorizations found")


def test_unknown_secret_and_bad_replies(broker, auth):
    c = authed(broker, b"nobody")  # the server answers 403
    c.expect_fatal("E_AUTH_FAILED", "E_AUTH_FAILED AUTH failed")
    auth.allow("s-ttl0", ALL, ttl=0)
    authed(broker, b"s-ttl0").expect_fatal("E_AUTH_FAILED")
    auth.allow("s-perm", [{"topic": ".*", "channels": [".*"], "permissions": ["admin"]}])
    authed(broker, b"s-perm").expect_fatal("E_AUTH_FAILED")


def test_partial_permissions(broker, auth):
    auth.allow("s-part", [{"topic": "^pubonly", "channels": [".*"], "permissions": ["publish"]},
                          {"topic": "sub", "channels": ["^mine$"], "permissions": ["subscribe"]}])
    c = authed(broker, b"s-part")
    c.expect_frame()
    c.publish(unique("pubonly"), b"x")
    c.send(C.pub("other", b"x"))
    c.expect_fatal("E_UNAUTHORIZED", 'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')
    c = authed(broker, b"s-part")
    c.expect_frame()
    c.send(C.sub("pubonly1", "mine"))  # publish does not imply subscribe
    c.expect_fatal("E_UNAUTHORIZED", 'E_UNAUTHORIZED AUTH failed for SUB on "pubonly1" "mine"')
    c = authed(broker, b"s-part")
    c.expect_frame()
    c.send(C.sub("xsubx", "notmine"))
    c.expect_fatal("E_UNAUTHORIZED")
    c = authed(broker, b"s-part")
    c.expect_frame()
    c.subscribe(unique("xsub"), "mine")  # unanchored topic rule, anchored channel rule
    c.close()


def test_auth_twice(broker, auth):
    auth.allow("s-all", ALL)
    c = authed(broker, b"s-all")
    c.expect_frame()
    c.send(C.auth(b"s-all"))
    c.expect_fatal("E_INVALID", "E_INVALID AUTH already set")


def test_ttl_expiry_asks_again_then_fails(broker, auth):
    auth.allow("s-ttl", ALL, ttl=1)
    c = authed(broker, b"s-ttl")
    c.expect_frame()
    topic = unique("ttl")
    while len(auth.requests_for("s-ttl")) < 2:  # publishes go on; one after the TTL asks the server again
        c.publish(topic, b"x")
    c.publish(topic, b"after refresh")
    auth.allow("s-ttl", ALL, ttl=1, status=500)  # the next query fails: fatal E_AUTH_FAILED
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        c.send(C.pub(topic, b"x"))
        frame = c.expect_frame()
        if frame[0] == 1:
            assert frame[1] == b"E_AUTH_FAILED AUTH failed"
            break
    else:
        raise AssertionError("the expired state was never checked again")
    c.expect_closed()


def test_server_down(module_nsqd_factory):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    broker = module_nsqd_factory(f"--auth-http-address=127.0.0.1:{port}")
    authed(broker, b"anything").expect_fatal("E_AUTH_FAILED", "E_AUTH_FAILED AUTH failed")


def test_slow_server_does_not_stall_other_clients(broker, auth):
    gate = threading.Event()
    auth.allow("s-slow", ALL, wait=gate)
    auth.allow("s-all", ALL)
    slow = authed(broker, b"s-slow")
    auth.wait_requests("s-slow", 1)
    others = []
    for _ in range(4):  # on both workers: none waits for the slow query
        c = authed(broker, b"s-all")
        c.expect_frame()
        c.publish(unique("fast"), b"x")
        others.append(c)
    assert slow.frames == []
    gate.set()
    assert json.loads(slow.expect_frame()[1])["permission_count"] == 1
    slow.publish(unique("slow"), b"x")
    for c in others + [slow]:
        c.close()


def test_post_method(module_nsqd_factory, auth):
    broker = module_nsqd_factory(f"--auth-http-address=http://{auth.address}/auth",
                                 "--auth-http-request-method=post")
    auth.allow("s-post", ALL)
    c = authed(broker, b"s-post")
    c.expect_frame()
    method, params, headers = auth.requests_for("s-post")[-1]
    assert method == "POST" and params["_raw"] == {"remote_ip": ["127.0.0.1"], "tls": ["false"],
                                                   "secret": ["s-post"], "common_name": [""]}
    c.close()


def test_auth_disabled(module_nsqd_factory):
    broker = module_nsqd_factory()
    with Conn(broker.address) as c:
        assert c.identify(feature_negotiation=True)["auth_required"] is False
        c.send(C.auth(b"x"))
        c.expect_fatal("E_AUTH_DISABLED", "E_AUTH_DISABLED AUTH disabled")
