"""nsqlookupd's V1 TCP protocol over raw sockets: the exact bytes of every reply and error, and what each command
does to the registrations (read back over HTTP). One lookupd for the module; each test uses its own names."""
from __future__ import annotations

import itertools
import json
import os
import struct

import pytest

from lookupd_wire import Lookupd, V1Conn, eventually, identify_body
from nsqpy.protocol import v1

_names = itertools.count()


def unique(prefix="t"):
    return f"{prefix}{os.getpid()}-{next(_names)}"


def reply(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


@pytest.fixture(scope="module")
def lk():
    lookupd = Lookupd("--broadcast-address=lookupd.example")
    yield lookupd
    assert lookupd.stop() == 0, lookupd.output()


GOOD = {"broadcast_address": "127.0.0.1", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"}

# (what is sent after the magic, the exact bytes lookupd answers before it closes the connection)
FATAL = [
    (b"REGISTER t\n", reply(b"E_INVALID client must IDENTIFY")),
    (b"UNREGISTER t c\n", reply(b"E_INVALID client must IDENTIFY")),
    (b"FOO bar\n", reply(b"E_INVALID invalid command FOO")),
    (b"\n", reply(b"E_INVALID invalid command ")),
    (b"  ping\n", reply(b"E_INVALID invalid command ping")),
    (identify_body({**GOOD, "tcp_port": 0}), reply(b"E_BAD_BODY IDENTIFY missing fields")),
    (identify_body({"broadcast_address": "h", "tcp_port": 1, "http_port": 2}),  # no version
     reply(b"E_BAD_BODY IDENTIFY missing fields")),
    (b"IDENTIFY\n" + struct.pack(">i", 5) + b"{nope", reply(b"E_BAD_BODY IDENTIFY failed to decode JSON body")),
    (b"IDENTIFY\n" + struct.pack(">i", 2) + b"[]", reply(b"E_BAD_BODY IDENTIFY failed to decode JSON body")),
    (identify_body({**GOOD, "tcp_port": "4150"}), reply(b"E_BAD_BODY IDENTIFY failed to decode JSON body")),
    (b"IDENTIFY\n" + struct.pack(">i", -1), reply(b"E_BAD_BODY IDENTIFY failed to read body")),
    (identify_body(GOOD) + b"IDENTIFY\n", reply(b"E_INVALID cannot IDENTIFY again")),
    (identify_body(GOOD) + b"REGISTER\n", reply(b"E_INVALID REGISTER insufficient number of params")),
    (identify_body(GOOD) + b"UNREGISTER\n", reply(b"E_INVALID UNREGISTER insufficient number of params")),
    (identify_body(GOOD) + b"REGISTER a!b\n", reply(b"E_BAD_TOPIC REGISTER topic name 'a!b' is not valid")),
    (identify_body(GOOD) + b"REGISTER " + b"x" * 65 + b"\n",
     reply(b"E_BAD_TOPIC REGISTER topic name '" + b"x" * 65 + b"' is not valid")),
    (identify_body(GOOD) + b"REGISTER t c:d\n", reply(b"E_BAD_CHANNEL REGISTER channel name 'c:d' is not valid")),
    (identify_body(GOOD) + b"UNREGISTER t# c\n", reply(b"E_BAD_TOPIC UNREGISTER topic name 't#' is not valid")),
    (identify_body(GOOD) + b"UNREGISTER t c#x\n", reply(b"E_BAD_CHANNEL UNREGISTER channel name 'c#x' is not valid")),
]


def _identify_reply(lk) -> bytes:
    data = {"broadcast_address": "lookupd.example", "hostname": os.uname().nodename, "http_port": lk.http_address[1],
            "tcp_port": lk.tcp_address[1], "version": "1.3.0"}
    return reply(json.dumps(data, separators=(",", ":"), sort_keys=True).encode())


@pytest.mark.parametrize("sent, answer", FATAL, ids=[repr(s[:40]) for s, _ in FATAL])
def test_every_error_is_fatal_with_nsqs_exact_bytes(lk, sent, answer):
    with V1Conn(lk.tcp_address) as c:
        c.send(sent)
        got = c.raw_until_closed()
    if sent.startswith(identify_body(GOOD)):
        answer = _identify_reply(lk) + answer  # the IDENTIFY that succeeded first answers lookupd's own info
    assert got == answer


def test_bad_magic_gets_e_bad_protocol_and_a_close(lk):
    with V1Conn(lk.tcp_address, magic=False) as c:
        c.send(b"  V2PING\n")
        assert c.raw_until_closed() == reply(b"E_BAD_PROTOCOL")


def test_a_line_past_16_kib_is_dropped_without_a_reply(lk):
    with V1Conn(lk.tcp_address) as c:
        c.send(b"REGISTER " + b"x" * 20000)
        assert c.raw_until_closed() == b""


def test_ping_before_and_after_identify_and_the_identify_reply(lk):
    with V1Conn(lk.tcp_address) as c:
        c.send(b"PING\n")
        assert c.reply() == b"OK"
        c.send(identify_body({**GOOD, "hostname": "h1", "unknown": [1, 2]}))
        assert reply(c.reply()) == _identify_reply(lk)
        c.send(b"PING\n", b"  PING  \r\n")  # trimmed of whitespace, as strings.TrimSpace
        assert [c.reply(), c.reply()] == [b"OK", b"OK"]


def test_register_unregister_and_disconnect(lk):
    topic, eph = unique(), unique() + "#ephemeral"
    with V1Conn(lk.tcp_address) as c:
        info = c.identify(tcp_port=5150, hostname="h2")
        assert info["tcp_port"] == lk.tcp_address[1]
        c.send(f"REGISTER {topic} ch\n".encode(), f"REGISTER {topic} ch\n".encode(), f"REGISTER {eph}\n".encode(),
               f"REGISTER {topic} e#ephemeral\n".encode())
        assert [c.reply() for _ in range(4)] == [b"OK"] * 4
        found = lk.lookup(topic)
        assert sorted(found["channels"]) == ["ch", "e#ephemeral"]
        [producer] = found["producers"]
        assert producer["tcp_port"] == 5150 and producer["hostname"] == "h2"
        assert list(producer) == ["remote_address", "hostname", "broadcast_address", "tcp_port", "http_port",
                                  "version"]
        assert producer["remote_address"] == "%s:%d" % c.sock.getsockname()
        # a channel's UNREGISTER keeps its key (NSQ never removes keys), except an ephemeral one's
        c.send(f"UNREGISTER {topic} ch\n".encode(), f"UNREGISTER {topic} e#ephemeral\n".encode())
        assert [c.reply(), c.reply()] == [b"OK", b"OK"]
        assert lk.get_json(f"/channels?topic={topic}") == {"channels": ["ch"]}
        assert lk.lookup(topic)["producers"] == [producer]  # still registered for the topic
        c.send(f"UNREGISTER {topic}\n".encode(), f"UNREGISTER {eph}\n".encode(), b"UNREGISTER never-seen\n")
        assert [c.reply() for _ in range(3)] == [b"OK"] * 3
        assert lk.lookup(topic) == {"channels": ["ch"], "producers": []}
        assert lk.lookup(eph) is None  # an ephemeral topic with no producer left is gone
        c.send(f"REGISTER {topic}\n".encode())
        assert c.reply() == b"OK"
        assert len(lk.lookup(topic)["producers"]) == 1
    # the connection closed: its registrations go, the keys stay
    eventually(lambda: lk.lookup(topic)["producers"] == [], what="producer gone after disconnect")
    assert topic in lk.get_json("/topics")["topics"]


def test_ping_refreshes_last_update_and_register_does_not(lk):
    topic = unique()
    with V1Conn(lk.tcp_address) as c:
        c.identify()
        c.send(f"REGISTER {topic}\n".encode())
        assert c.reply() == b"OK"

        def last_update():
            [entry] = lk.get_json("/debug")[f"topic:{topic}:"]
            return entry["last_update"]
        first = last_update()
        c.send(f"REGISTER {topic} c\n".encode())
        assert c.reply() == b"OK"
        assert last_update() == first
        c.send(b"PING\n")
        assert c.reply() == b"OK"
        assert last_update() > first


def test_two_connections_are_two_producers_of_one_topic(lk):
    topic = unique()
    with V1Conn(lk.tcp_address) as a, V1Conn(lk.tcp_address) as b:
        a.identify(tcp_port=1001)
        b.identify(tcp_port=1002)
        for c in (a, b):
            c.send(f"REGISTER {topic} ch\n".encode())
            assert c.reply() == b"OK"
        assert lk.producer_ports(topic) == [1001, 1002]
        a.sock.close()
        eventually(lambda: lk.producer_ports(topic) == [1002], what="a's registration dropped")
    eventually(lambda: lk.producer_ports(topic) == [], what="b's registration dropped")


def test_pipelined_commands_in_one_write_are_answered_in_order(lk):
    topic = unique()
    with V1Conn(lk.tcp_address) as c:
        c.send(b"PING\n" + identify_body(GOOD) + b"".join(f"REGISTER {topic} c{i}\n".encode() for i in range(50))
               + b"PING\n")
        replies = [c.reply() for _ in range(53)]
        assert replies[0] == b"OK" and replies[1].startswith(b"{") and replies[2:] == [b"OK"] * 51
    assert len(lk.get_json(f"/channels?topic={topic}")["channels"]) == 50


def test_byte_at_a_time_is_parsed_like_one_write(lk):
    topic = unique()
    with V1Conn(lk.tcp_address, magic=False) as c:
        for b in v1.MAGIC_V1 + identify_body(GOOD) + f"REGISTER {topic}\n".encode():
            c.send(bytes([b]))
        assert c.reply().startswith(b"{")
        assert c.reply() == b"OK"
    assert topic in lk.get_json("/topics")["topics"]


def test_lookupd_survives_bad_clients(lk):
    """Garbage, early closes and errors on many connections; the server keeps serving."""
    for junk in (b"", b" ", b"  V1", b"  V1IDENTIFY\n\x00\x00", b"\xff" * 100, b"  V1" + b"\x00" * 5000 + b"\n"):
        with V1Conn(lk.tcp_address, magic=False) as c:
            c.send(junk)
            c.sock.shutdown(1)
            c.raw_until_closed()
    with V1Conn(lk.tcp_address) as c:
        c.send(b"PING\n")
        assert c.reply() == b"OK"
    assert lk.request("GET", "/ping")[2] == b"OK"
    assert lk.proc.poll() is None and " died " not in lk.output()  # no child was restarted either
