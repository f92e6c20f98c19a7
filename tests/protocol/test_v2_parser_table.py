"""Server-role parsing: exact input bytes -> exact commands, and every parse error with its text and fatality."""

import struct

import pytest

from codec_helpers import ID, ID2, normalize, parse
from nsqpy.protocol import (
    Auth, Cls, Dpub, Fin, FinBatch, Identify, Mpub, Nop, Pub, Rdy, Req, Sub, Touch, V2Parser)
from nsqpy.protocol.errors import DropConnection, ProtocolError
from nsqpy.protocol.states import STATE_CLOSING, STATE_INIT, STATE_SUBSCRIBED


def i32(n):
    return struct.pack(">i", n)


def mpub_body(*bodies, count=None, size=None):
    inner = i32(len(bodies) if count is None else count) + b"".join(i32(len(b)) + b for b in bodies)
    return i32(len(inner) if size is None else size) + inner


INIT, SUBD, CLOSING = STATE_INIT, STATE_SUBSCRIBED, STATE_CLOSING
NAME64 = b"a" * 54 + b"#ephemeral"

PARSED = [
    (INIT, b"IDENTIFY\n" + i32(2) + b"{}", [Identify(b"{}")]),
    (INIT, b"IDENTIFY extra\r\n" + i32(2) + b"{}", [Identify(b"{}")]),
    (INIT, b"AUTH\n" + i32(3) + b"abc", [Auth(b"abc")]),
    (INIT, b"SUB t c\n", [Sub("t", "c")]),
    (INIT, b"SUB " + NAME64 + b" .c-_#ephemeral extra\r\n", [Sub(NAME64.decode(), ".c-_#ephemeral")]),
    (INIT, b"PUB t\n" + i32(3) + b"a\nb", [Pub("t", b"a\nb")]),
    (SUBD, b"PUB t\n" + i32(1) + b"x", [Pub("t", b"x")]),
    (INIT, b"MPUB t\n" + mpub_body(b"a", b"bb"), [Mpub("t", b"", None, None)]),
    (INIT, b"DPUB t 0\n" + i32(1) + b"x", [Dpub("t", 0, b"x")]),
    (INIT, b"DPUB t 3600000\n" + i32(1) + b"x", [Dpub("t", 3600000, b"x")]),
    (SUBD, b"RDY\n", [Rdy(1)]),
    (SUBD, b"RDY \n", [Rdy(0)]),
    (SUBD, b"RDY 0\n", [Rdy(0)]),
    (SUBD, b"RDY 2500\r\n", [Rdy(2500)]),
    (SUBD, b"RDY 5 junk\n", [Rdy(5)]),
    (SUBD, b"RDY 1\nRDY 2\nRDY 3\n", [Rdy(3)]),
    (CLOSING, b"RDY 1\nRDY -5\nRDY x\n", []),  # ignored silently in closing, even malformed
    (SUBD, b"FIN " + ID + b"\n", [Fin(ID)]),
    (CLOSING, b"FIN " + ID + b"\r\n", [Fin(ID)]),
    (SUBD, b"FIN " + ID + b" ignored\n", [Fin(ID)]),
    (SUBD, b"FIN 0123456789ABCDEF\n", [Fin(b"0123456789ABCDEF")]),
    (SUBD, b"FIN " + ID + b"\nFIN " + ID2 + b"\r\nFIN " + ID + b" x\n", [Fin(ID), Fin(ID2), Fin(ID)]),
    (SUBD, b"REQ " + ID + b" 0\n", [Req(ID, 0)]),
    (SUBD, b"REQ " + ID + b" 1000\n", [Req(ID, 1000)]),
    (SUBD, b"REQ " + ID + b" 3600001\n", [Req(ID, 3600000)]),  # clamped, not rejected
    (SUBD, b"REQ " + ID + b" 99999999999999999999\n", [Req(ID, 0)]),  # Go's wrap to a negative duration
    (CLOSING, b"TOUCH " + ID + b"\n", [Touch(ID)]),
    (SUBD, b"CLS\n", [Cls()]),
    (INIT, b"NOP\n", [Nop()]),
    (CLOSING, b"NOP\r\n", [Nop()]),
]


@pytest.mark.parametrize("state, data, expected", PARSED)
def test_parse(state, data, expected):
    got = normalize(parse(data, state))
    if expected and isinstance(expected[0], Mpub):
        assert len(got) == 1 and list(got[0].bodies()) == [b"a", b"bb"] and got[0].topic == "t"
        return
    assert got == expected


def test_fin_run_is_one_batch_with_hex_flags():
    data = b"".join(b"FIN %016x\n" % i for i in range(1000)) + b"FIN 0123456789abcdeX\n"
    [batch] = parse(data, SUBD)
    assert isinstance(batch, FinBatch) and len(batch) == 1001
    assert batch.values[:1000].tolist() == list(range(1000))
    assert batch.valid[:1000].all() and not batch.valid[1000]
    assert bytes(batch.ids[1000]) == b"0123456789abcdeX"


def test_state_follows_sub_and_cls():
    parser = V2Parser(expect_magic=False)
    out = parser.feed(b"SUB t c\nRDY 3\nCLS\nRDY 4\nFIN " + ID + b"\n")
    assert out == [Sub("t", "c"), Rdy(3), Cls(), Fin(ID)]
    assert parser.state == STATE_CLOSING


E_INVALID, E_BAD_BODY, E_BAD_TOPIC = "E_INVALID", "E_BAD_BODY", "E_BAD_TOPIC"
E_BAD_CHANNEL, E_BAD_MESSAGE = "E_BAD_CHANNEL", "E_BAD_MESSAGE"

ERRORS = [
    (INIT, b"FOO\n", E_INVALID, "invalid command FOO"),
    (INIT, b"\n", E_INVALID, "invalid command "),
    (INIT, b"\r\n", E_INVALID, "invalid command "),
    (INIT, b"pub t\n", E_INVALID, "invalid command pub"),
    (SUBD, b"IDENTIFY\n", E_INVALID, "cannot IDENTIFY in current state"),
    (INIT, b"IDENTIFY\n" + i32(0), E_BAD_BODY, "IDENTIFY invalid body size 0"),
    (INIT, b"IDENTIFY\n" + i32(-1), E_BAD_BODY, "IDENTIFY invalid body size -1"),
    (INIT, b"IDENTIFY\n" + i32(5242881), E_BAD_BODY, "IDENTIFY body too big 5242881 > 5242880"),
    (SUBD, b"AUTH\n", E_INVALID, "cannot AUTH in current state"),
    (INIT, b"AUTH x\n", E_INVALID, "AUTH invalid number of parameters"),
    (INIT, b"AUTH\n" + i32(0), E_BAD_BODY, "AUTH invalid body size 0"),
    (INIT, b"AUTH\n" + i32(5242881), E_BAD_BODY, "AUTH body too big 5242881 > 5242880"),
    (SUBD, b"SUB t c\n", E_INVALID, "cannot SUB in current state"),
    (INIT, b"SUB t\n", E_INVALID, "SUB insufficient number of parameters"),
    (INIT, b"SUB  c\n", E_BAD_TOPIC, 'SUB topic name "" is not valid'),
    (INIT, b"SUB t! c\n", E_BAD_TOPIC, 'SUB topic name "t!" is not valid'),
    (INIT, b"SUB " + b"a" * 65 + b" c\n", E_BAD_TOPIC, 'SUB topic name "' + "a" * 65 + '" is not valid'),
    (INIT, b"SUB t c#eph\n", E_BAD_CHANNEL, 'SUB channel name "c#eph" is not valid'),
    (INIT, b"SUB t \xff\"\n", E_BAD_CHANNEL, 'SUB channel name "\\xff\\"" is not valid'),
    (INIT, b"RDY 1\n", E_INVALID, "cannot RDY in current state"),
    (SUBD, b"RDY -1\n", E_INVALID, "RDY could not parse count -1"),
    (SUBD, b"RDY 1\nRDY +2\n", E_INVALID, "RDY could not parse count +2"),
    (SUBD, b"RDY 2501\n", E_INVALID, "RDY count 2501 out of range 0-2500"),
    (SUBD, b"RDY 1\nRDY 2501\n", E_INVALID, "RDY count 2501 out of range 0-2500"),
    (SUBD, b"RDY 18446744073709551615\n", E_INVALID, "RDY count -1 out of range 0-2500"),
    (INIT, b"FIN " + ID + b"\n", E_INVALID, "cannot FIN in current state"),
    (SUBD, b"FIN\n", E_INVALID, "FIN insufficient number of params"),
    (SUBD, b"FIN \n", E_INVALID, "invalid message ID"),
    (SUBD, b"FIN 0123\n", E_INVALID, "invalid message ID"),
    (SUBD, b"FIN " + ID + b"0\n", E_INVALID, "invalid message ID"),
    (SUBD, b"FIN 0123456789abcde\r\n", E_INVALID, "invalid message ID"),
    (SUBD, b"FIN " + ID + b"\nFIN " + ID + b"\nFIN x\n", E_INVALID, "invalid message ID"),
    (INIT, b"REQ " + ID + b" 0\n", E_INVALID, "cannot REQ in current state"),
    (SUBD, b"REQ " + ID + b"\n", E_INVALID, "REQ insufficient number of params"),
    (SUBD, b"REQ 01 0\n", E_INVALID, "invalid message ID"),
    (SUBD, b"REQ " + ID + b" -1\n", E_INVALID, "REQ could not parse timeout -1"),
    (SUBD, b"REQ " + ID + b" 1s\n", E_INVALID, "REQ could not parse timeout 1s"),
    (INIT, b"TOUCH " + ID + b"\n", E_INVALID, "cannot TOUCH in current state"),
    (SUBD, b"TOUCH\n", E_INVALID, "TOUCH insufficient number of params"),
    (SUBD, b"TOUCH abc\n", E_INVALID, "invalid message ID"),
    (INIT, b"CLS\n", E_INVALID, "cannot CLS in current state"),
    (CLOSING, b"CLS\n", E_INVALID, "cannot CLS in current state"),
    (INIT, b"PUB\n", E_INVALID, "PUB insufficient number of parameters"),
    (INIT, b"PUB x!\n", E_BAD_TOPIC, 'PUB topic name "x!" is not valid'),
    (INIT, b"PUB t\n" + i32(0), E_BAD_MESSAGE, "PUB invalid message body size 0"),
    (INIT, b"PUB t\n" + i32(-7), E_BAD_MESSAGE, "PUB invalid message body size -7"),
    (INIT, b"PUB t\n" + i32(1048577), E_BAD_MESSAGE, "PUB message too big 1048577 > 1048576"),
    (INIT, b"MPUB\n", E_INVALID, "MPUB insufficient number of parameters"),
    (INIT, b"MPUB x!\n", E_BAD_TOPIC, 'E_BAD_TOPIC MPUB topic name "x!" is not valid'),
    (INIT, b"MPUB t\n" + i32(0), E_BAD_BODY, "MPUB invalid body size 0"),
    (INIT, b"MPUB t\n" + i32(5242881), E_BAD_BODY, "MPUB body too big 5242881 > 5242880"),
    (INIT, b"MPUB t\n" + i32(10) + i32(0), E_BAD_BODY, "MPUB invalid message count 0"),
    (INIT, b"MPUB t\n" + i32(10) + i32(1048576), E_BAD_BODY, "MPUB invalid message count 1048576"),
    (INIT, b"MPUB t\n" + mpub_body(b"a", b""), E_BAD_MESSAGE, "MPUB invalid message(1) body size 0"),
    (INIT, b"MPUB t\n" + i32(99) + i32(2) + i32(1) + b"a" + i32(1048577), E_BAD_MESSAGE,
     "MPUB message too big 1048577 > 1048576"),
    (INIT, b"DPUB t\n", E_INVALID, "DPUB insufficient number of parameters"),
    (INIT, b"DPUB t! 1\n", E_BAD_TOPIC, 'DPUB topic name "t!" is not valid'),
    (INIT, b"DPUB t -1\n", E_INVALID, "DPUB could not parse timeout -1"),
    (INIT, b"DPUB t 3600001\n", E_INVALID, "DPUB timeout 3600001 out of range 0-3600000"),
    (INIT, b"DPUB t 1\n" + i32(0), E_BAD_MESSAGE, "DPUB invalid message body size 0"),
    (INIT, b"DPUB t 1\n" + i32(1048577), E_BAD_MESSAGE, "DPUB message too big 1048577 > 1048576"),
]


@pytest.mark.parametrize("state, data, code, text", ERRORS)
def test_parse_error(state, data, code, text):
    err = parse(data, state)[-1]
    assert isinstance(err, ProtocolError) and err.fatal
    assert (err.code, err.description) == (code, text)
    assert err.frame() == struct.pack(">ii", len(err.data()) + 4, 1) + f"{code} {text}".encode("utf-8", "surrogateescape")


def test_error_comes_after_the_commands_before_it():
    out = parse(b"NOP\nPUB t\n" + i32(1) + b"x" + b"FIN " + ID + b"\nNOP\n")
    assert out[:2] == [Nop(), Pub("t", b"x")]
    assert out[2].description == "cannot FIN in current state" and len(out) == 3


def test_wrong_magic_is_e_bad_protocol_and_parser_then_refuses_input():
    parser = V2Parser()
    [err] = parser.feed(b"  V1PING\n")
    assert err.frame() == b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL" and err.fatal
    with pytest.raises(RuntimeError):
        parser.feed(b"NOP\n")


def test_magic_split_over_feeds():
    parser = V2Parser()
    assert parser.feed(b" ") == [] and parser.feed(b" V") == []
    assert parser.feed(b"2NOP\n") == [Nop()]


def test_long_line_drops_silently():
    parser = V2Parser(expect_magic=False)
    assert parser.feed(b"A" * 16383) == []
    [err] = parser.feed(b"B")
    assert isinstance(err, DropConnection) and err.frame() == b"" and err.fatal
    assert parse(b"PUB " + b"t" * 16379 + b"\n")[-1].code == E_BAD_TOPIC  # 16384 bytes with "\n": still read
    assert isinstance(parse(b"PUB " + b"t" * 16380 + b"\n")[-1], DropConnection)


def test_limits_come_from_the_caller():
    assert parse(b"PUB t\n" + i32(11), max_msg_size=10)[-1].description == "PUB message too big 11 > 10"
    assert parse(b"DPUB t 6\n", max_req_timeout_ms=5)[-1].description == "DPUB timeout 6 out of range 0-5"
    assert parse(b"REQ " + ID + b" 6\n", STATE_SUBSCRIBED, max_req_timeout_ms=5) == [Req(ID, 5)]
    assert parse(b"RDY 11\n", STATE_SUBSCRIBED, max_rdy_count=10)[-1].description == "RDY count 11 out of range 0-10"
    # count limit (max_body_size - 4) / 5
    assert parse(b"MPUB t\n" + i32(10) + i32(2), max_body_size=13)[-1].description == "MPUB invalid message count 2"
    assert list(parse(b"MPUB t\n" + mpub_body(b"a"), max_body_size=13)[0].bodies()) == [b"a"]


def test_mpub_ignores_declared_body_size_like_nsqd():
    got = parse(b"MPUB t\n" + mpub_body(b"ab", size=1) + b"NOP\n")
    assert list(got[0].bodies()) == [b"ab"] and got[1:] == [Nop()]


def test_mpub_messages_may_not_outgrow_max_body_size():
    err = parse(b"MPUB t\n" + mpub_body(b"abc", b"def", size=5), max_body_size=15)[-1]
    assert err.code == E_BAD_BODY and err.fatal


def test_stop_after_sub_hands_over_the_rest():
    parser = V2Parser(expect_magic=False, stop_after_sub=True)
    assert parser.feed(b"NOP\nSUB t c\nRDY 3\nCLS\nPUB") == [Nop(), Sub("t", "c")]
    assert parser.take_buffer() == b"RDY 3\nCLS\nPUB"
    assert parser.buffered == 0
    other = V2Parser(expect_magic=False, state=parser.state)
    assert other.feed(b"RDY 3\nCLS\n") == [Rdy(3), Cls()]


def test_stop_after_sub_resumes_on_empty_feed():
    parser = V2Parser(expect_magic=False, stop_after_sub=True)
    assert parser.feed(b"SUB t c\nRDY 3\n") == [Sub("t", "c")]
    assert parser.feed(b"") == [Rdy(3)]
