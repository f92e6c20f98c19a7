"""nsqlookupd's HTTP API over real HTTP against the gunicorn-served app: every endpoint's exact JSON, status codes
and headers, every error, consistency across gunicorn workers, the inactive-producer timeout and tombstones."""
from __future__ import annotations

import itertools
import json
import os
import socket

import pytest

from lookupd_wire import Lookupd, V1Conn, eventually

_names = itertools.count()
V1_HEADER = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"


def unique(prefix="h"):
    return f"{prefix}{os.getpid()}-{next(_names)}"


@pytest.fixture(scope="module")
def lk():
    lookupd = Lookupd("--http-workers=2")
    yield lookupd
    assert lookupd.stop() == 0, lookupd.output()


def expect(lk, method, path, status, body, content_type=JSON_TYPE):
    got_status, headers, got = lk.request(method, path)
    assert (got_status, got) == (status, body), (method, path)
    assert headers.get("content-type") == content_type
    assert headers.get("x-nsq-content-type") == V1_HEADER
    return headers


def test_ping_is_plain_text_without_the_v1_header(lk):
    status, headers, body = lk.request("GET", "/ping")
    assert (status, body) == (200, b"OK")
    assert headers["content-type"] == "text/plain; charset=utf-8"
    assert "x-nsq-content-type" not in headers


def test_info(lk):
    expect(lk, "GET", "/info", 200, b'{"version":"1.3.0"}')


ERRORS = [
    ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
    ("GET", "/lookup?topic=", 404, "TOPIC_NOT_FOUND"),
    ("GET", "/lookup?topic=nope-never", 404, "TOPIC_NOT_FOUND"),
    ("GET", "/lookup?topic=a%zz", 400, "INVALID_REQUEST"),
    ("GET", "/lookup?topic=a;b", 400, "INVALID_REQUEST"),
    ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/topic/create?topic=a!b", 400, "INVALID_ARG_TOPIC"),
    ("POST", "/topic/create?topic=", 400, "INVALID_ARG_TOPIC"),
    ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=t&channel=c!", 400, "INVALID_ARG_CHANNEL"),
    ("POST", "/channel/create?topic=t!&channel=c!", 400, "INVALID_ARG_TOPIC"),
    ("POST", "/channel/delete?topic=t", 400, "MISSING_ARG_CHANNEL"),
    ("POST", "/channel/delete?topic=nope-never&channel=c", 404, "CHANNEL_NOT_FOUND"),
    ("POST", "/topic/tombstone?node=a:1", 400, "MISSING_ARG_TOPIC"),
    ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
    ("GET", "/nope", 404, "NOT_FOUND"),
    ("GET", "/debug/pprof", 404, "NOT_FOUND"),
    ("GET", "/topic/create?topic=t", 405, "METHOD_NOT_ALLOWED"),
    ("POST", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
    ("DELETE", "/topics", 405, "METHOD_NOT_ALLOWED"),
    ("PUT", "/ping", 405, "METHOD_NOT_ALLOWED"),
    ("FOO", "/ping", 405, "METHOD_NOT_ALLOWED"),       # a method no route serves: 405 too, as httprouter
    ("FOO", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
    ("FOO", "/nope", 404, "NOT_FOUND"),
]


@pytest.mark.parametrize("method, path, status, code", ERRORS, ids=[f"{m} {p}" for m, p, _, _ in ERRORS])
def test_errors(lk, method, path, status, code):
    expect(lk, method, path, status, b'{"message":"%s"}' % code.encode())


@pytest.mark.parametrize("method", ["FOO", "POST", "OPTIONS"])
@pytest.mark.parametrize("path, allow", [("/ping", "GET, OPTIONS"), ("/topic/create?topic=t", "OPTIONS, POST")])
def test_allow_lists_the_routes_methods_as_httprouter(lk, method, path, allow):
    status, headers, body = lk.request(method, path)
    if method == "OPTIONS":
        assert (status, body) == (200, b"")
    elif method != "POST" or path == "/ping":
        assert (status, body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    else:
        return  # POST is /topic/create's own method
    assert headers["allow"] == allow


def test_parameters_come_from_the_query_string_only(lk):
    status, _, body = lk.request("POST", "/topic/create", body=b"topic=x",
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert (status, body) == (400, b'{"message":"MISSING_ARG_TOPIC"}')


def test_topics_and_channels_created_and_deleted_over_http(lk):
    t, t2 = unique(), unique()
    status, headers, body = lk.request("POST", f"/topic/create?topic={t}")
    assert (status, body) == (200, b"")
    assert "content-type" not in headers and headers["x-nsq-content-type"] == V1_HEADER  # NSQ's empty 200
    assert t in lk.get_json("/topics")["topics"]
    expect(lk, "GET", f"/lookup?topic={t}", 200, b'{"channels":[],"producers":[]}')
    expect(lk, "GET", f"/channels?topic={t}", 200, b'{"channels":[]}')
    assert lk.request("POST", f"/channel/create?topic={t2}&channel=c1")[0] == 200  # creates the topic too
    assert lk.request("POST", f"/channel/create?topic={t2}&channel=c2%23ephemeral")[0] == 200
    expect(lk, "GET", f"/channels?topic={t2}", 200, b'{"channels":["c1","c2#ephemeral"]}')
    expect(lk, "GET", f"/lookup?topic={t2}", 200, b'{"channels":["c1","c2#ephemeral"],"producers":[]}')
    assert lk.request("POST", f"/channel/delete?topic={t2}&channel=c1")[:3:2] == (200, b"")
    expect(lk, "GET", f"/channels?topic={t2}", 200, b'{"channels":["c2#ephemeral"]}')
    expect(lk, "POST", f"/channel/delete?topic={t2}&channel=c1", 404, b'{"message":"CHANNEL_NOT_FOUND"}')
    for topic in (t, t2, "never-there"):
        assert lk.request("POST", f"/topic/delete?topic={topic}")[:3:2] == (200, b"")  # absent is fine
    topics = lk.get_json("/topics")["topics"]
    assert t not in topics and t2 not in topics
    expect(lk, "GET", f"/channels?topic={t2}", 200, b'{"channels":[]}')


def test_every_gunicorn_worker_sees_a_change_at_once(lk):
    """The registry owns the database: whichever worker answers, a change made through any of them is there."""
    for _ in range(5):
        t = unique()
        assert lk.request("POST", f"/topic/create?topic={t}")[0] == 200
        for _ in range(8):  # new connections: the kernel spreads them over the workers
            assert lk.lookup(t) == {"channels": [], "producers": []}
        assert lk.request("POST", f"/topic/delete?topic={t}")[0] == 200
        for _ in range(8):
            assert lk.lookup(t) is None


def test_lookup_nodes_and_debug_json_with_a_producer(lk):
    t1, t2 = unique("a"), unique("b")
    with V1Conn(lk.tcp_address) as c:
        c.identify(broadcast_address="node.example", tcp_port=4250, http_port=4251, hostname="host<&>")
        for cmd in (f"REGISTER {t1} ch", f"REGISTER {t2}"):
            c.send(cmd.encode() + b"\n")
            assert c.reply() == b"OK"
        remote = "%s:%d" % c.sock.getsockname()
        peer = (b'{"remote_address":"%s","hostname":"host\\u003c\\u0026\\u003e","broadcast_address":"node.example",'
                b'"tcp_port":4250,"http_port":4251,"version":"1.3.0"' % remote.encode())
        expect(lk, "GET", f"/lookup?topic={t1}", 200, b'{"channels":["ch"],"producers":[' + peer + b"}]}")
        nodes = lk.get_json("/nodes")["producers"]
        [node] = [n for n in nodes if n["remote_address"] == remote]
        assert list(node) == ["remote_address", "hostname", "broadcast_address", "tcp_port", "http_port", "version",
                              "tombstones", "topics"]
        assert node["topics"] == [t1, t2] and node["tombstones"] == [False, False]
        debug = lk.get_json("/debug")
        [entry] = debug[f"channel:{t1}:ch"]
        assert list(entry) == ["broadcast_address", "hostname", "http_port", "id", "last_update", "tcp_port",
                               "tombstoned", "tombstoned_at", "version"]
        assert entry["id"] == remote and entry["tombstoned"] is False
        assert entry["tombstoned_at"] == -6795364578871345152  # Go's zero time in ns
        assert any(p["id"] == remote for p in debug["client::"])
        assert f"topic:{t2}:" in debug


def test_tombstone_hides_a_producer_from_lookup_for_its_lifetime(lookupd_factory):
    lk = lookupd_factory("--tombstone-lifetime=2s")
    t = unique()
    with V1Conn(lk.tcp_address) as a, V1Conn(lk.tcp_address) as b:
        a.identify(broadcast_address="127.0.0.1", tcp_port=5001, http_port=5101)
        b.identify(broadcast_address="127.0.0.1", tcp_port=5002, http_port=5102)
        for c in (a, b):
            c.send(f"REGISTER {t}\n".encode(), f"REGISTER {t}-other\n".encode())
            assert [c.reply(), c.reply()] == [b"OK", b"OK"]
        assert lk.request("POST", f"/topic/tombstone?topic={t}&node=127.0.0.1:5101")[:3:2] == (200, b"")
        assert lk.request("POST", f"/topic/tombstone?topic={t}&node=127.0.0.1:9999")[0] == 200  # no such node
        assert lk.producer_ports(t) == [5002]
        assert lk.producer_ports(f"{t}-other") == [5001, 5002]  # only that topic's registration
        nodes = {n["tcp_port"]: n for n in lk.get_json("/nodes")["producers"]}
        assert nodes[5001]["topics"] == [t, f"{t}-other"] and nodes[5001]["tombstones"] == [True, False]
        assert nodes[5002]["tombstones"] == [False, False]
        debug = {e["tcp_port"]: e for e in lk.get_json("/debug")[f"topic:{t}:"]}
        assert debug[5001]["tombstoned"] is True and debug[5001]["tombstoned_at"] > 0
        assert debug[5002]["tombstoned"] is False
        eventually(lambda: lk.producer_ports(t) == [5001, 5002], what="tombstone expired")
        assert {n["tcp_port"]: n["tombstones"] for n in lk.get_json("/nodes")["producers"]}[5001] == [False, False]


def test_inactive_producers_drop_out_until_they_ping(lookupd_factory):
    lk = lookupd_factory("--inactive-producer-timeout=1s")
    t = unique()
    with V1Conn(lk.tcp_address) as quiet, V1Conn(lk.tcp_address) as pinging:
        quiet.identify(tcp_port=6001)
        pinging.identify(tcp_port=6002)
        for c in (quiet, pinging):
            c.send(f"REGISTER {t}\n".encode())
            assert c.reply() == b"OK"
        assert lk.producer_ports(t) == [6001, 6002]

        def only_the_pinging_one():
            pinging.send(b"PING\n")
            assert pinging.reply() == b"OK"
            return lk.producer_ports(t) == [6002]
        eventually(only_the_pinging_one, what="the quiet producer dropped out", pause=0.2)
        assert [n["tcp_port"] for n in lk.get_json("/nodes")["producers"]] == [6002]
        assert f"topic:{t}:" in lk.get_json("/debug")  # still registered, only not listed
        quiet.send(b"PING\n")
        assert quiet.reply() == b"OK"
        assert lk.producer_ports(t) == [6001, 6002]


def test_bad_http_input_leaves_the_server_serving(lk):
    junk = [b"\r\n\r\n", b"GARBAGE\r\n\r\n", b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n",
            b"GET /ping HTTP/1.1\r\n" + b"X: " + b"y" * 20000 + b"\r\n\r\n", b"\x16\x03\x01\x02\x00" + b"\x00" * 100,
            b"POST /topic/create?topic=t HTTP/1.1\r\nContent-Length: 10\r\n\r\nab"]
    for data in junk:
        with socket.create_connection(lk.http_address, timeout=30) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
    for _ in range(4):
        assert lk.request("GET", "/ping")[2] == b"OK"
    assert json.loads(lk.request("GET", "/info")[2]) == {"version": "1.3.0"}
    assert lk.proc.poll() is None and " died " not in lk.output()  # no child was restarted either
