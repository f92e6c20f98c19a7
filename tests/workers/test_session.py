"""Session (workers/domain/session.py), one V2 connection, without a broker: bytes in through ``on_data`` (as the
pump hands them over), replies and frames out through a real socketpair, the worker a small fake
(tests/workers/fakes.py ``FakeSessionHost``, which implements ``hosts.SessionHost``) whose SUB joins a real
channel on a real message log.

What must hold (spec section 1, the commands and the error table): IDENTIFY's negotiation; SUB/RDY/FIN/REQ/TOUCH/
CLS/NOP; every malformed command answered with its NSQ error code, fatal ones followed by the close (after the
replies queued before them) and nothing after them handled, non-fatal ones (E_FIN_FAILED, E_REQ_FAILED,
E_TOUCH_FAILED) leaving the connection as it was; RDY above max-rdy-count; in-flight at the RDY edge; output
buffering (MAX_WBUF stops reading, a partial send waits for the socket, a fatal error lingers); a parked publish
holding what follows in order; the one fast FIN rule (``Session.fin_fast_path``) and its FIN answered like the
parser's."""
import json
import time

import pytest

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from nsqpy.protocol.states import STATE_CLOSING, STATE_SUBSCRIBED
from nsqpy.workers.domain.e2e import new_window
from nsqpy.workers.domain.session import LINGER, MAX_WBUF
from tests.workers.fakes import Client, publish, session_host  # noqa: F401 (fixture)

OK = (FRAME_RESPONSE, b"OK")


def connect(host, **kwargs):
    c = Client(host, **kwargs)
    c.send(C.magic())
    return c


def subscribed(host, rdy=None, channel="c", **identify):
    c = connect(host)
    if identify:
        c.send(C.identify(identify))
        c.frames()
    c.send(C.sub("t", channel))
    assert c.frames() == [OK]
    if rdy is not None:
        c.send(C.rdy(rdy))
    return c


def messages(frames):
    return [C.decode_message(data) for kind, data in frames if kind == FRAME_MESSAGE]


def errors(frames):
    return [data for kind, data in frames if kind == FRAME_ERROR]


def closed(c):
    """The session ended the connection: the client reads EOF after the frames, and the session is closed (a
    silent drop) or lingers, reading and discarding, until the client closes or LINGER passes (fired here)."""
    c.frames()
    s = c.session
    if not c.eof:
        return False
    if not s.closed:
        if not s.closing_after_flush or c.host.loop.fire(s.close) != 1:
            return False
    return s.closed and s in c.host.forgotten


# ---- IDENTIFY ---------------------------------------------------------------------------------------------
def test_identify_without_feature_negotiation_is_answered_ok(session_host):
    c = connect(session_host())
    c.send(C.identify({"client_id": "a", "heartbeat_interval": 5000}))
    assert c.frames() == [OK]
    assert c.session.settings.client_id == "a" and c.session.settings.heartbeat_interval_ms == 5000


def test_identify_with_feature_negotiation_answers_the_negotiated_settings(session_host):
    host = session_host(max_rdy_count=77)
    c = connect(host)
    c.send(C.identify({"feature_negotiation": True, "msg_timeout": 12345, "heartbeat_interval": 4000}))
    [(kind, data)] = c.frames()
    reply = json.loads(data)
    assert kind == FRAME_RESPONSE and reply["max_rdy_count"] == 77 and reply["msg_timeout"] == 12345
    assert reply["tls_v1"] is False and reply["snappy"] is False and reply["deflate"] is False
    assert c.session.settings.msg_timeout_ms == 12345
    # the heartbeat schedule restarted with the negotiated interval
    assert [t.delay for t in host.loop.live()] == [pytest.approx(4.0, abs=0.5)]


@pytest.mark.parametrize("body, code", [
    (b"{not json", b"E_BAD_BODY"),
    (json.dumps({"heartbeat_interval": 10}).encode(), b"E_BAD_BODY"),  # below 1 s and not -1: out of range
    (json.dumps({"sample_rate": 101}).encode(), b"E_BAD_BODY"),
])
def test_a_bad_identify_is_fatal(session_host, body, code):
    c = connect(session_host())
    c.send(b"IDENTIFY\n" + len(body).to_bytes(4, "big") + body)
    [err] = errors(c.frames())
    assert err.startswith(code) and closed(c)


def test_identify_may_come_again_before_sub(session_host):
    """nsqd's state stays init after IDENTIFY: a second one negotiates again (after SUB it is fatal: the table)."""
    c = connect(session_host())
    c.send(C.identify({"client_id": "a"}), C.identify({"client_id": "b"}))
    assert c.frames() == [OK, OK] and c.session.settings.client_id == "b"


def test_sub_with_heartbeats_disabled_is_fatal(session_host):
    c = connect(session_host())
    c.send(C.identify({"heartbeat_interval": -1}))
    assert c.frames() == [OK]
    c.send(C.sub("t", "c"))
    assert errors(c.frames()) == [b"E_INVALID cannot SUB with heartbeats disabled"] and closed(c)


def test_with_tls_required_every_command_but_identify_is_fatal(session_host):
    host = session_host(tls_required=1, tls_cert="", tls_key="")
    c = connect(host)
    assert not c.session.fin_fast_path() and not host.pump.clean[c.session.fd]
    c.send(C.pub("t", b"m"))
    assert errors(c.frames()) == [b"E_INVALID cannot PUB in current state (TLS required)"] and closed(c)
    assert host.published == []


# ---- SUB, RDY, FIN, REQ, TOUCH, CLS, NOP ------------------------------------------------------------------
def test_a_consumer_gets_at_most_rdy_messages_and_each_fin_frees_one(session_host):
    host = session_host()
    c = subscribed(host)
    publish(host.topic.log, [b"m%d" % i for i in range(5)])
    ch = host.channel("c")
    ch.wants_delivery()
    c.send()
    assert c.frames() == []  # RDY 0: nothing
    c.send(C.rdy(3))
    got = messages(c.frames())
    assert [m.body for m in got] == [b"m0", b"m1", b"m2"] and c.session.in_flight == 3
    assert not c.session.ready_for_more()  # in flight == RDY: the edge
    c.send(C.fin(got[0].id))
    more = messages(c.frames())
    assert [m.body for m in more] == [b"m3"] and c.session.in_flight == 3 and c.session.finish_count == 1
    c.send(C.rdy(0))
    c.send(C.fin(got[1].id), C.fin(got[2].id))
    assert messages(c.frames()) == [] and c.session.in_flight == 1  # RDY 0 stops delivery at once
    assert c.session.message_count == 4


def test_a_full_in_flight_table_holds_a_consumers_rdy_back_until_fins_free_slots(session_host):
    """RDY is the consumer's bound; the worker's in-flight table is the broker's: with 2 slots and RDY 5, two
    messages go out, and each FIN lets exactly one more through (back-pressure, not loss)."""
    host = session_host(capacity=2)
    c = subscribed(host, rdy=5)
    publish(host.topic.log, [b"m%d" % i for i in range(4)])
    host.channel("c").wants_delivery()
    c.send()
    got = messages(c.frames())
    assert [m.body for m in got] == [b"m0", b"m1"] and c.session.ready_for_more()
    for k in range(2):
        c.send(C.fin(got[k].id))
        host.pending |= host.table_blocked  # (the worker's idle step: slots were freed)
        host.table_blocked.clear()
        c.send()
        got += messages(c.frames())
    assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"] and c.session.in_flight == 2


def test_req_redelivers_with_the_next_attempt_and_touch_answers_nothing(session_host):
    host = session_host()
    c = subscribed(host, rdy=1)
    publish(host.topic.log, [b"a"])
    host.channel("c").wants_delivery()
    c.send()
    [m] = messages(c.frames())
    assert m.attempts == 1
    c.send(C.touch(m.id), C.nop())
    assert c.frames() == []
    c.send(C.req(m.id, 0))
    [again] = messages(c.frames())
    assert (again.id, again.body, again.attempts) == (m.id, b"a", 2) and c.session.requeue_count == 1


def test_cls_answers_close_wait_and_fin_still_works_while_closing(session_host):
    host = session_host()
    c = subscribed(host, rdy=1)
    publish(host.topic.log, [b"a", b"b"])
    host.channel("c").wants_delivery()
    c.send()
    [m] = messages(c.frames())
    c.send(C.cls())
    assert c.frames() == [(FRAME_RESPONSE, b"CLOSE_WAIT")]
    assert c.session.rdy == 0 and c.session.state == STATE_CLOSING and not c.session.closed
    assert not c.session.fin_fast_path()  # only a subscribed session's FINs skip the parser
    c.send(C.fin(m.id))
    assert c.frames() == [] and c.session.in_flight == 0 and c.session.finish_count == 1
    c.send(C.rdy(5))  # RDY in closing is ignored silently
    assert c.frames() == [] and c.session.rdy == 0 and not c.session.closed


@pytest.mark.parametrize("fast", [True, False], ids=["one-read-fin", "pipelined-fin"])
def test_a_fin_of_an_unknown_id_is_a_non_fatal_error(session_host, fast):
    """Both ways a FIN arrives (a read that is one whole FIN skips the parser; one behind another command does
    not) answer an unknown id the same: E_FIN_FAILED, and the connection goes on."""
    host = session_host()
    c = subscribed(host, rdy=1)
    unknown = b"%016x" % 0xabc
    c.send(C.fin(unknown)) if fast else c.send(C.nop() + C.fin(unknown))
    assert errors(c.frames()) == [b"E_FIN_FAILED FIN " + unknown + b" failed ID not in flight"]
    publish(host.topic.log, [b"after"])
    host.channel("c").wants_delivery()
    c.send()
    assert [m.body for m in messages(c.frames())] == [b"after"] and not c.session.closed


def test_another_consumers_message_is_not_ours_to_finish(session_host):
    host = session_host()
    a, b = subscribed(host, rdy=1), subscribed(host, rdy=0)
    publish(host.topic.log, [b"x"])
    host.channel("c").wants_delivery()
    a.send()
    [m] = messages(a.frames())
    b.send(C.fin(m.id))
    assert errors(b.frames()) == [b"E_FIN_FAILED FIN " + m.id + b" failed client does not own message"]
    a.send(C.fin(m.id))
    assert a.frames() == [] and a.session.finish_count == 1


@pytest.mark.parametrize("line, code", [(C.req(b"%016x" % 5, 0), b"E_REQ_FAILED"),
                                        (C.touch(b"%016x" % 5), b"E_TOUCH_FAILED")], ids=["REQ", "TOUCH"])
def test_req_and_touch_of_an_unknown_id_are_non_fatal(session_host, line, code):
    c = subscribed(session_host(), rdy=1)
    c.send(line)
    [err] = errors(c.frames())
    assert err.startswith(code) and b"ID not in flight" in err and not c.session.closed
    c.send(C.nop())
    assert not c.session.closed


def test_rdy_above_max_rdy_count_is_fatal(session_host):
    c = subscribed(session_host(max_rdy_count=100))
    c.send(C.rdy(100))
    assert c.frames() == [] and c.session.rdy == 100
    c.send(C.rdy(101))
    assert errors(c.frames()) == [b"E_INVALID RDY count 101 out of range 0-100"] and closed(c)


# ---- malformed commands: the error table ------------------------------------------------------------------
MSG_ID = b"%016x" % 1
BAD = [  # (name, state to reach first, bytes, error code, fatal)
    ("unknown verb", "init", b"FOO\n", b"E_INVALID invalid command FOO", True),
    ("empty line", "init", b"\n", b"E_INVALID", True),
    ("PUB without topic", "init", b"PUB\n", b"E_INVALID", True),
    ("PUB bad topic", "init", b"PUB bad!topic\n", b"E_BAD_TOPIC", True),
    ("PUB empty body", "init", b"PUB t\n\x00\x00\x00\x00", b"E_BAD_MESSAGE", True),
    ("PUB body over max-msg-size", "init", b"PUB t\n\x7f\x00\x00\x00", b"E_BAD_MESSAGE", True),
    ("MPUB zero size", "init", b"MPUB t\n\x00\x00\x00\x00", b"E_BAD_BODY", True),
    ("MPUB bad topic", "init", b"MPUB b@d\n", b"E_BAD_TOPIC", True),
    ("DPUB negative defer", "init", b"DPUB t -1\n", b"E_INVALID", True),
    ("DPUB over max-req-timeout", "init", b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range", True),
    ("SUB one param", "init", b"SUB t\n", b"E_INVALID", True),
    ("SUB bad channel", "init", b"SUB t bad!ch\n", b"E_BAD_CHANNEL", True),
    ("RDY before SUB", "init", b"RDY 1\n", b"E_INVALID", True),
    ("FIN before SUB", "init", b"FIN " + MSG_ID + b"\n", b"E_INVALID", True),
    ("CLS before SUB", "init", b"CLS\n", b"E_INVALID", True),
    ("SUB twice", "sub", b"SUB t c\n", b"E_INVALID", True),
    ("IDENTIFY after SUB", "sub", C.identify({}), b"E_INVALID", True),
    ("RDY not a number", "sub", b"RDY x\n", b"E_INVALID", True),
    ("RDY negative", "sub", b"RDY -1\n", b"E_INVALID", True),
    ("FIN short id", "sub", b"FIN 123\n", b"E_INVALID", True),
    ("FIN without id", "sub", b"FIN\n", b"E_INVALID", True),
    ("REQ one param", "sub", b"REQ " + MSG_ID + b"\n", b"E_INVALID", True),
    ("REQ timeout -1", "sub", b"REQ " + MSG_ID + b" -1\n", b"E_INVALID", True),
    ("TOUCH short id", "sub", b"TOUCH abc\n", b"E_INVALID", True),
    ("FIN not in flight", "sub", b"FIN " + MSG_ID + b"\n", b"E_FIN_FAILED", False),
    ("REQ not in flight", "sub", b"REQ " + MSG_ID + b" 0\n", b"E_REQ_FAILED", False),
    ("TOUCH not in flight", "sub", b"TOUCH " + MSG_ID + b"\n", b"E_TOUCH_FAILED", False),
]


@pytest.mark.parametrize("name, state, data, code, fatal", BAD, ids=[b[0] for b in BAD])
def test_a_malformed_command_gets_its_error_code_and_fatal_ones_close(session_host, name, state, data, code,
                                                                      fatal):
    host = session_host()
    c = subscribed(host) if state == "sub" else connect(host)
    c.send(data + C.pub("t", b"after"))  # what follows it in the same read
    frames = c.frames()
    [err] = errors(frames)
    assert err.startswith(code)
    if fatal:
        assert closed(c) and frames[-1][0] == FRAME_ERROR  # nothing after a fatal error, then the close
        assert host.published == [] and not host.pump.clean[c.session.fd]
    else:
        assert not c.session.closed and frames[-1] == OK and host.published == [("t", [b"after"], 0, "PUB")]


def test_wrong_magic_is_e_bad_protocol_then_the_close(session_host):
    c = Client(session_host())
    c.send(b"  V1")
    [err] = errors(c.frames())
    assert err.startswith(b"E_BAD_PROTOCOL") and closed(c)


def test_a_line_over_the_read_buffer_drops_the_connection_without_a_frame(session_host):
    c = connect(session_host())
    c.send(b"PUB " + b"t" * (17 << 10))
    assert c.frames() == [] and closed(c)


def test_replies_queued_before_a_fatal_error_go_out_first(session_host):
    host = session_host()
    c = connect(host)
    c.send(C.pub("t", b"1") + C.pub("t", b"2") + b"FOO\n" + C.pub("t", b"3"))
    frames = c.frames()
    assert frames == [OK, OK, (FRAME_ERROR, b"E_INVALID invalid command FOO")] and closed(c)
    assert [p[1] for p in host.published] == [[b"1"], [b"2"]]


def test_a_publish_to_a_full_topic_is_a_fatal_failed_error(session_host):
    host = session_host()
    host.full.add("t")
    c = connect(host)
    c.send(C.mpub("t", [b"a", b"b"]))
    assert errors(c.frames()) == [b"E_MPUB_FAILED MPUB failed topic t is full"] and closed(c)


# ---- held sessions: a parked publish ----------------------------------------------------------------------
def test_a_parked_publish_holds_what_follows_in_order_until_its_ok(session_host):
    host = session_host()
    c = connect(host)
    host.park = True
    c.send(C.pub("t", b"1") + C.pub("t", b"2"))
    s = c.session
    assert s.held and s.fd in host.pump.paused and c.frames() == []
    assert [p[1] for p in host.published] == [[b"1"]]  # the second waits, parsed, behind the first
    s.on_data(C.pub("t", b"3"))  # (bytes read before the pump stopped: kept, not parsed yet)
    host.park = False
    host.answer_parked()
    host.deliver_and_flush()
    assert c.frames() == [OK, OK, OK] and [p[1] for p in host.published] == [[b"1"], [b"2"], [b"3"]]
    assert not s.held and s.fd not in host.pump.paused


def test_a_session_closed_while_held_is_not_released_into_handling(session_host):
    host = session_host()
    c = connect(host)
    host.park = True
    c.send(C.pub("t", b"1") + C.pub("t", b"2"))
    c.session.close()
    host.answer_parked()
    assert len(host.published) == 1 and c.session.closed


# ---- output buffering ---------------------------------------------------------------------------------------
def test_output_past_max_wbuf_stops_reading_until_the_socket_drains(session_host):
    host = session_host()
    c = connect(host, sock_buffer=1 << 16)
    s = c.session
    s.write(b"x" * (MAX_WBUF + 1))  # (a consumer that stopped reading: frames pile up)
    s.on_data(C.nop())
    assert not s.reading and s.fd in host.pump.paused
    assert not s.flush() and s.writing and s.fd in host.loop.writers  # the socket took only part of it
    assert host.pump.busy[s.fd] == 1  # no OK of the pump's may overtake what is queued
    for _ in range(10_000):  # (bounded: a session that never drains fails)
        if not s.writing:
            break
        try:
            c.peer.recv(1 << 20)
        except BlockingIOError:
            pass
        host.loop.writers[s.fd]()  # the loop: the socket has room
    assert not s.wbuf and s.reading and s.fd not in host.pump.paused and s.fd not in host.loop.writers
    assert host.pump.busy[s.fd] == 0


def test_below_max_wbuf_reading_goes_on(session_host):
    host = session_host()
    c = connect(host)
    s = c.session
    s.write(b"x" * (MAX_WBUF - 100))
    s.on_data(C.nop())
    assert s.reading and s.fd not in host.pump.paused


def test_a_fatal_error_behind_backed_up_output_closes_only_after_the_flush_and_lingers(session_host):
    host = session_host()
    c = connect(host, sock_buffer=1 << 16)
    s = c.session
    s.write(b"y" * (1 << 20))
    s.on_data(b"FOO\n")
    assert s.closing_after_flush and not s.closed  # the frame waits behind what is queued
    s.on_data(C.pub("t", b"ignored"))  # read and discarded meanwhile
    assert host.published == []
    data, eof = b"", False
    for _ in range(10_000):  # (bounded: a session that never finishes fails)
        try:
            chunk = c.peer.recv(1 << 20)
        except BlockingIOError:
            s.flush()
            continue
        if not chunk:
            eof = True  # our side shut down after the error frame
            break
        data += chunk
    assert eof and data.endswith(b"E_INVALID invalid command FOO") and len(data) > 1 << 20
    assert not s.closed and [t.delay for t in host.loop.live() if t.callback == s.close] == [LINGER]
    assert host.loop.fire(s.close) == 1 and s.closed


def test_writes_after_the_close_are_dropped(session_host):
    host = session_host()
    c = connect(host)
    c.session.close()
    c.session.write(b"late")
    assert c.session.wbuf == b"" and c.session not in host.dirty


# ---- heartbeats and the read deadline -----------------------------------------------------------------------
def test_a_heartbeat_goes_out_and_a_silent_client_is_dropped_after_two_intervals(session_host):
    host = session_host()
    c = connect(host)
    s = c.session
    s._next_heartbeat = time.monotonic() - 1  # the interval has passed
    assert host.loop.fire(s._on_heartbeat) == 1
    host.deliver_and_flush()
    assert c.frames() == [(FRAME_RESPONSE, b"_heartbeat_")] and not s.closed
    host.pump.last_read[s.fd] = time.monotonic() - 2 * s.settings.heartbeat_interval_ms / 1000 - 1
    assert host.loop.fire(s._on_heartbeat) == 1
    assert s.closed and ("info", "PROTOCOL(V2): [127.0.0.1:4150] read timeout; closing") in host.log.lines


# ---- the fast FIN rule ------------------------------------------------------------------------------------
def test_fin_fast_path_says_when_a_fin_may_skip_the_parser(session_host):
    host = session_host()
    c = subscribed(host, rdy=1)
    s = c.session
    ch = host.channel("c")
    assert s.fin_fast_path() and s.fin_fast_path(ch)
    c.send(b"FIN 01")  # half a command: the parser holds it
    assert not s.fin_fast_path()
    c.send(b"23456789abcdef\n")
    assert errors(c.frames()) and s.fin_fast_path()  # (its E_FIN_FAILED: nothing in flight)
    ch.e2e = new_window(type("O", (), {"e2e_processing_latency_percentile": [0.5],
                                       "e2e_processing_latency_window_time": 600 * 10**9})())
    assert s.fin_fast_path() and not s.fin_fast_path(ch)  # the lane records no latency: Python's FIN does
    ch.e2e = None
    s.held = True
    assert not s.fin_fast_path()
    s.held = False
    s._tls_missing = True
    assert not s.fin_fast_path()
    s._tls_missing = False
    s.on_data(b"FOO\n")
    assert not s.fin_fast_path() and s.state == STATE_SUBSCRIBED


def test_a_fin_that_skips_the_parser_frees_its_message_like_one_that_does_not(session_host):
    host = session_host()
    c = subscribed(host, rdy=2)
    publish(host.topic.log, [b"a", b"b"])
    host.channel("c").wants_delivery()
    c.send()
    a, b = messages(c.frames())
    assert c.session.fin_fast_path()
    c.send(C.fin(a.id))                  # alone in its read: straight to the channel
    c.send(C.fin(b.id)[:5], C.fin(b.id)[5:])  # split over two reads: the parser's
    assert c.frames() == [] and c.session.in_flight == 0 and c.session.finish_count == 2
    assert len(host.inflight) == 0
