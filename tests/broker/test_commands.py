"""Spec 1.1 and 1.4 over real sockets: each command's reply (or its silence), each error with NSQ's fixed text,
fatal errors closing the connection right after the error frame, non-fatal ones leaving it working, and the
client states (init -> subscribed -> closing).

Silence is checked by ordering, not by waiting: a command that must not reply is followed by a PUB, whose OK
must be the very next frame.
"""
import struct

import pytest

from nsqpy.protocol import client as C
from wire import Conn, consumer, holding, producer, unique

ID = b"0123456789abcdef"


@pytest.fixture(scope="module")
def addr(shared_nsqd):
    return shared_nsqd.address


def sync(conn):
    """A PUB whose OK must be the next frame: proves that nothing was sent before it."""
    conn.send(C.pub(unique("sync"), b"x"))
    conn.expect_response(b"OK")


# ---- success replies --------------------------------------------------------------------------------------
def test_identify_pub_mpub_dpub_answer_ok(addr):
    topic = unique()
    with Conn(addr) as c:
        c.send(C.identify({"client_id": "x"}), C.pub(topic, b"a"), C.mpub(topic, [b"b", b"c"]),
               C.dpub(topic, 0, b"d"), C.dpub(topic, 10, b"e"))
        for _ in range(5):
            c.expect_response(b"OK")
        sync(c)


def test_sub_answers_ok_and_cls_answers_close_wait_without_closing(addr):
    with consumer(addr, unique(), "ch") as c:
        c.send(C.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.expect_no_frame(0.3)
        sync(c)


def test_nop_rdy_fin_req_touch_send_nothing(addr):
    _, c, [msg] = holding(addr, b"m")
    with c:
        c.send(C.nop(), C.touch(msg.id), C.req(msg.id, 0))
        again = c.read_message()  # REQ 0: back at once; nothing else came first
        assert (again.id, again.attempts) == (msg.id, 2)
        c.send(C.fin(again.id), C.nop(), C.rdy(1), C.rdy(1))
        sync(c)


def test_pub_and_nop_in_every_state(addr):
    topic = unique()
    with Conn(addr) as c:
        c.send(C.nop(), C.pub(topic, b"init"))
        c.expect_response(b"OK")
        c.subscribe(unique(), "ch")
        c.send(C.nop(), C.pub(topic, b"subscribed"))
        c.expect_response(b"OK")
        c.send(C.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(C.nop(), C.pub(topic, b"closing"), C.mpub(topic, [b"x"]), C.dpub(topic, 5, b"y"))
        for _ in range(3):
            c.expect_response(b"OK")
    with consumer(addr, topic, "ch", rdy=10) as r:
        assert sorted(m.body for m in r.read_messages(5)) == [b"closing", b"init", b"subscribed", b"x", b"y"]


def test_crlf_line_endings(addr):
    topic = unique()
    with Conn(addr) as c:
        c.send(b"PUB " + topic.encode() + b"\r\n" + struct.pack(">i", 2) + b"hi", b"NOP\r\n")
        c.expect_response(b"OK")
        sync(c)


# ---- fatal errors: exact text, then the connection is closed ----------------------------------------------
def body(data):
    return struct.pack(">i", len(data)) + data


FATAL = [
    (b"FOO\n", "E_INVALID invalid command FOO"),
    (b"\n", "E_INVALID invalid command "),
    (b"nop\n", "E_INVALID invalid command nop"),
    (b"IDENTIFY\n" + body(b"{nope"), "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"IDENTIFY\n" + struct.pack(">i", 0), "E_BAD_BODY IDENTIFY invalid body size 0"),
    (b"IDENTIFY\n" + struct.pack(">i", 5242881), "E_BAD_BODY IDENTIFY body too big 5242881 > 5242880"),
    (b"AUTH\n" + body(b"secret"), "E_AUTH_DISABLED AUTH disabled"),
    (b"SUB t\n", "E_INVALID SUB insufficient number of parameters"),
    (b"SUB t! c\n", 'E_BAD_TOPIC SUB topic name "t!" is not valid'),
    (b"SUB t c!\n", 'E_BAD_CHANNEL SUB channel name "c!" is not valid'),
    (b"SUB t  c\n", 'E_BAD_CHANNEL SUB channel name "" is not valid'),
    (b"SUB " + b"t" * 65 + b" c\n", f'E_BAD_TOPIC SUB topic name "{"t" * 65}" is not valid'),
    (b"PUB\n", "E_INVALID PUB insufficient number of parameters"),
    (b"PUB  t\n", 'E_BAD_TOPIC PUB topic name "" is not valid'),
    (b"PUB a/b\n", 'E_BAD_TOPIC PUB topic name "a/b" is not valid'),
    (b"PUB t\n" + struct.pack(">i", 0), "E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"PUB t\n" + struct.pack(">i", -5), "E_BAD_MESSAGE PUB invalid message body size -5"),
    (b"PUB t\n" + struct.pack(">i", 1048577), "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
    (b"MPUB\n", "E_INVALID MPUB insufficient number of parameters"),
    (b"MPUB t%\n", 'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "t%" is not valid'),
    (b"MPUB t\n" + struct.pack(">i", 0), "E_BAD_BODY MPUB invalid body size 0"),
    (b"MPUB t\n" + struct.pack(">i", 5242881), "E_BAD_BODY MPUB body too big 5242881 > 5242880"),
    (b"MPUB t\n" + struct.pack(">ii", 8, 0), "E_BAD_BODY MPUB invalid message count 0"),
    (b"MPUB t\n" + struct.pack(">iii", 8, 1, 0), "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    (b"MPUB t\n" + struct.pack(">iiiBi", 8, 2, 1, 120, 1048577),
     "E_BAD_MESSAGE MPUB message too big 1048577 > 1048576"),
    (b"DPUB t\n", "E_INVALID DPUB insufficient number of parameters"),
    (b"DPUB t x\n", "E_INVALID DPUB could not parse timeout x"),
    (b"DPUB t -1\n", "E_INVALID DPUB could not parse timeout -1"),
    (b"DPUB t 3600001\n", "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"DPUB t! 5\n", 'E_BAD_TOPIC DPUB topic name "t!" is not valid'),
    (b"DPUB t 5\n" + struct.pack(">i", 0), "E_BAD_MESSAGE DPUB invalid message body size 0"),
    # state: everything that needs a subscription, in init
    (b"RDY 1\n", "E_INVALID cannot RDY in current state"),
    (b"FIN " + ID + b"\n", "E_INVALID cannot FIN in current state"),
    (b"REQ " + ID + b" 0\n", "E_INVALID cannot REQ in current state"),
    (b"TOUCH " + ID + b"\n", "E_INVALID cannot TOUCH in current state"),
    (b"CLS\n", "E_INVALID cannot CLS in current state"),
]


@pytest.mark.parametrize("data, text", FATAL, ids=[t.split(" ", 1)[1][:40] for _, t in FATAL])
def test_fatal_error_text_then_close(addr, data, text):
    with Conn(addr) as c:
        c.send(data)
        c.expect_fatal(text.split(" ", 1)[0], text)


SUBSCRIBED_FATAL = [
    (b"SUB t c\n", "E_INVALID cannot SUB in current state"),
    (b"IDENTIFY\n" + body(b"{}"), "E_INVALID cannot IDENTIFY in current state"),
    (b"AUTH\n" + body(b"s"), "E_INVALID cannot AUTH in current state"),
    (b"RDY x\n", "E_INVALID RDY could not parse count x"),
    (b"RDY -1\n", "E_INVALID RDY could not parse count -1"),
    (b"RDY 2501\n", "E_INVALID RDY count 2501 out of range 0-2500"),
    (b"FIN\n", "E_INVALID FIN insufficient number of params"),
    (b"FIN 0123\n", "E_INVALID invalid message ID"),
    (b"FIN " + ID + b"0\n", "E_INVALID invalid message ID"),
    (b"REQ " + ID + b"\n", "E_INVALID REQ insufficient number of params"),
    (b"REQ " + ID + b" -1\n", "E_INVALID REQ could not parse timeout -1"),
    (b"REQ abc 0\n", "E_INVALID invalid message ID"),
    (b"TOUCH\n", "E_INVALID TOUCH insufficient number of params"),
    (b"TOUCH 12345678901234567\n", "E_INVALID invalid message ID"),
    (b"BOGUS\n", "E_INVALID invalid command BOGUS"),
]


@pytest.mark.parametrize("data, text", SUBSCRIBED_FATAL, ids=[t.split(" ", 1)[1][:40] for _, t in SUBSCRIBED_FATAL])
def test_fatal_error_when_subscribed(addr, data, text):
    with consumer(addr, unique(), "ch") as c:
        c.send(data)
        c.expect_fatal(text.split(" ", 1)[0], text)


def test_cls_twice_is_fatal(addr):
    with consumer(addr, unique(), "ch") as c:
        c.send(C.cls(), C.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.expect_fatal("E_INVALID", "E_INVALID cannot CLS in current state")


def test_commands_before_a_fatal_error_run_and_those_after_do_not(addr):
    topic = unique()
    with Conn(addr) as c:
        c.send(C.pub(topic, b"before"), b"WHAT\n", C.pub(topic, b"after"))
        c.expect_response(b"OK")
        c.expect_fatal("E_INVALID", "E_INVALID invalid command WHAT")
    with consumer(addr, topic, "ch", rdy=10) as r:
        assert r.read_message().body == b"before"
        r.expect_no_frame(0.3)


# ---- connection set-up --------------------------------------------------------------------------------------
@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET / HTTP/1.1\r\n", b"\x00\x00\x00\x00"])
def test_wrong_magic_is_bad_protocol_then_close(addr, magic):
    with Conn(addr, magic=False) as c:
        c.send(magic)
        c.expect_fatal("E_BAD_PROTOCOL", "E_BAD_PROTOCOL")


def test_short_magic_then_eof_closes_silently(addr):
    with Conn(addr, magic=False) as c:
        c.send(b"  ")
        c.half_close()
        c.expect_closed()


def test_line_longer_than_16k_closes_silently(addr):
    with Conn(addr) as c:
        c.send(b"PUB " + b"t" * 16384)
        c.expect_closed()


def test_eof_mid_command_closes(addr):
    with Conn(addr) as c:
        c.send(b"PUB t\n" + struct.pack(">i", 10) + b"abc")
        c.half_close()
        c.expect_closed()


# ---- non-fatal errors: the connection keeps working ---------------------------------------------------------
def test_fin_req_touch_unknown_id_are_non_fatal(addr):
    topic = unique()
    with consumer(addr, topic, "ch", rdy=1) as c:
        c.send(C.fin(ID))
        c.expect_error("E_FIN_FAILED", "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
        c.send(C.req(ID, 0))
        c.expect_error("E_REQ_FAILED", "E_REQ_FAILED REQ 0123456789abcdef failed ID not in flight")
        c.send(C.touch(ID))
        c.expect_error("E_TOUCH_FAILED", "E_TOUCH_FAILED TOUCH 0123456789abcdef failed ID not in flight")
        c.send(C.fin(b"zzzzzzzzzzzzzzzz"))  # 16 bytes but not hex: still just not in flight
        c.expect_error("E_FIN_FAILED", "E_FIN_FAILED FIN zzzzzzzzzzzzzzzz failed ID not in flight")
        sync(c)
        producer(addr, topic, b"still delivered")
        msg = c.read_message()
        assert msg.body == b"still delivered"
        c.send(C.fin(msg.id))
        sync(c)


def test_fin_run_with_unknown_ids_is_non_fatal(addr):
    """Several FIN lines in one packet take the parser's batch path; the unknown one still fails alone."""
    _, c, [a, b] = holding(addr, b"a", b"b")
    with c:
        c.send(C.fin(a.id), C.fin(ID), C.fin(b.id))
        c.expect_error("E_FIN_FAILED", "E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight")
        sync(c)
        c.send(C.fin(a.id))
        c.expect_error("E_FIN_FAILED", f"E_FIN_FAILED FIN {a.id.decode()} failed ID not in flight")
        c.expect_no_frame(0.2)


def test_only_the_holder_may_fin_req_touch(addr):
    topic = unique()
    producer(addr, topic, b"m")
    with consumer(addr, topic, "ch", rdy=1) as holder, consumer(addr, topic, "ch", rdy=1) as other:
        msg = holder.read_message()
        for cmd, verb in ((C.fin(msg.id), "FIN"), (C.req(msg.id, 0), "REQ"), (C.touch(msg.id), "TOUCH")):
            other.send(cmd)
            other.expect_error(f"E_{verb}_FAILED",
                               f"E_{verb}_FAILED {verb} {msg.id.decode()} failed client does not own message")
        sync(other)
        holder.send(C.fin(msg.id))
        sync(holder)


def test_fin_twice_second_fails(addr):
    _, c, [msg] = holding(addr, b"m")
    with c:
        c.send(C.fin(msg.id), C.fin(msg.id))
        c.expect_error("E_FIN_FAILED", f"E_FIN_FAILED FIN {msg.id.decode()} failed ID not in flight")
        sync(c)


# ---- closing state ---------------------------------------------------------------------------------------
def test_rdy_after_cls_is_ignored_and_fin_still_allowed(addr):
    topic = unique()
    producer(addr, topic, b"one", b"two")
    with consumer(addr, topic, "ch", rdy=1) as c:
        msg = c.read_message()
        c.send(C.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(C.rdy(10), b"RDY bogus\n", C.fin(msg.id))
        sync(c)  # RDY ignored silently (even an unparsable one), FIN accepted
        c.expect_no_frame(0.3)  # RDY 0 since CLS: "two" is not delivered
        c.send(C.fin(msg.id))
        c.expect_error("E_FIN_FAILED")  # the first FIN really finished it


def test_req_and_touch_after_cls(addr):
    topic, c, [msg] = holding(addr, b"m")
    with c:
        c.send(C.cls())
        c.expect_response(b"CLOSE_WAIT")
        c.send(C.touch(msg.id), C.req(msg.id, 0))
        sync(c)
        c.expect_no_frame(0.3)  # requeued, but this client is closing: not redelivered to it
    with consumer(addr, topic, "ch", rdy=1) as d:
        again = d.read_message()
        assert (again.id, again.body, again.attempts) == (msg.id, b"m", 2)
