"""nsqlookupd V1 (spec 4.1), both roles, as exact bytes."""

import json
import struct

import pytest

from nsqpy.protocol import v1
from nsqpy.protocol.errors import DropConnection, ProtocolError

PEER = {"broadcast_address": "h", "tcp_port": 4150, "http_port": 4151, "version": "1.3.0"}


def i32(n):
    return struct.pack(">i", n)


def identified():
    parser = v1.V1Parser(expect_magic=False)
    [cmd] = parser.feed(v1.identify(PEER))
    assert isinstance(cmd, v1.IdentifyV1)
    return parser


def test_client_encoders():
    assert v1.magic() == b"  V1"
    assert v1.ping() == b"PING\n"
    assert v1.register("t") == b"REGISTER t\n" and v1.register("t", "c") == b"REGISTER t c\n"
    assert v1.unregister("t") == b"UNREGISTER t\n" and v1.unregister("t", "c") == b"UNREGISTER t c\n"
    body = json.dumps(PEER, separators=(",", ":")).encode()
    assert v1.identify(PEER) == b"IDENTIFY\n" + i32(len(body)) + body


def test_server_parses_a_session():
    parser = v1.V1Parser()
    data = b"  V1" + v1.ping() + v1.identify(dict(PEER, hostname="x")) + b"  REGISTER t c \r\n" + \
        v1.register("t") + v1.unregister("t", "c") + v1.unregister("t") + b"REGISTER t  c\n"
    out = parser.feed(data)
    assert out[0] == v1.Ping()
    assert out[1].peer == v1.PeerInfo("h", 4150, 4151, "1.3.0", hostname="x")
    assert out[2:] == [v1.Register("t", "c"), v1.Register("t"), v1.Unregister("t", "c"), v1.Unregister("t"),
                       v1.Register("t")]


def test_byte_by_byte_gives_the_same():
    data = b"  V1" + v1.ping() + v1.identify(PEER) + v1.register("t", "c")
    parser = v1.V1Parser()
    out = []
    for i in range(len(data)):
        out += parser.feed(data[i:i + 1])
    assert out == v1.V1Parser().feed(data)
    assert parser.buffered == 0


ERRORS = [
    (False, b"FOO\n", b"E_INVALID invalid command FOO"),
    (False, b"\n", b"E_INVALID invalid command "),
    (False, b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (False, b"UNREGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (True, b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (True, b"UNREGISTER \n", b"E_INVALID UNREGISTER insufficient number of params"),
    (True, b"REGISTER t!\n", b"E_BAD_TOPIC REGISTER topic name 't!' is not valid"),
    (True, b"UNREGISTER t c!\n", b"E_BAD_CHANNEL UNREGISTER channel name 'c!' is not valid"),
    (True, b"IDENTIFY\n", b"E_INVALID cannot IDENTIFY again"),
    (False, b"IDENTIFY\n" + i32(2) + b"{}", b"E_BAD_BODY IDENTIFY missing fields"),
    (False, b"IDENTIFY\n" + i32(2) + b"{]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (False, b"IDENTIFY\n" + i32(-1), b"E_BAD_BODY IDENTIFY failed to read body"),
]


@pytest.mark.parametrize("identify_first, data, text", ERRORS)
def test_errors_are_fatal_and_unframed(identify_first, data, text):
    parser = identified() if identify_first else v1.V1Parser(expect_magic=False)
    err = parser.feed(data)[-1]
    assert isinstance(err, ProtocolError) and err.fatal
    assert v1.error_reply(err) == i32(len(text)) + text


def test_wrong_magic():
    [err] = v1.V1Parser().feed(b"  V2NOP\n")
    assert v1.error_reply(err) == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


def test_long_line_is_dropped():
    [err] = v1.V1Parser(expect_magic=False).feed(b"P" * 16384)
    assert isinstance(err, DropConnection) and v1.error_reply(err) == b""


def test_replies_and_decoder():
    assert v1.OK_REPLY == b"\x00\x00\x00\x02OK"
    resp = v1.identify_response(4160, 4161, "1.3.0", "lk", "host")
    assert resp == b'{"broadcast_address":"lk","hostname":"host","http_port":4161,"tcp_port":4160,"version":"1.3.0"}'
    stream = v1.OK_REPLY + v1.reply(resp) + v1.error_reply(ProtocolError("x"))
    decoder = v1.ReplyDecoder()
    got = []
    for i in range(len(stream)):
        got += decoder.feed(stream[i:i + 1])
    assert got == [b"OK", resp, b"E_INVALID x"]
    assert [v1.is_error(r) for r in got] == [False, False, True]
