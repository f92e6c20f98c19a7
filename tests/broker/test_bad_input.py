"""Hypothesis-generated command streams and raw garbage over real sockets, against one broker for the module.

Model streams are lists of ops whose replies are known from the spec (1.4, 1.5): valid commands with their reply
or silence, non-fatal FIN/REQ/TOUCH failures, and at most one fatal op, always last (nothing after a fatal error
is read by the broker, and bytes left unread would turn the close into a reset). The bytes are cut into random
chunks. Each connection must get exactly the modelled frames, then be closed after a fatal error, or stay open
and answer a final PUB. Garbage streams only have to get well-formed frames, nothing after a fatal error frame,
and a close once we stop sending. Meanwhile a bystander consumer and producer stay connected; the last test
checks that they, and a fresh client, are still served, and that no process of the broker died.
"""
import json
import re
import struct
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from wire import FATAL_CODES, NON_FATAL_CODES, Conn, consumer, unique

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VERBS = {b"IDENTIFY", b"AUTH", b"SUB", b"PUB", b"MPUB", b"DPUB", b"RDY", b"FIN", b"REQ", b"TOUCH", b"CLS", b"NOP"}
NAME = re.compile(rb"^[.a-zA-Z0-9_-]+(#ephemeral)?$")
TOPICS = [unique("bad") for _ in range(3)]
SUB_TOPIC = unique("badsub")  # nothing is ever published to it, so subscribers get no messages
OK = (FRAME_RESPONSE, b"OK", True)


class Bystanders(NamedTuple):
    topic: str
    consumer: Conn
    producer: Conn

    def keep_alive(self):
        """Hypothesis may run a test for longer than the 60 s read deadline: a NOP each example resets it."""
        self.consumer.send(C.nop())
        self.producer.send(C.nop())


class Op(NamedTuple):
    data: bytes
    replies: tuple = ()   # (frame_type, data, exact): exact=False means data is a prefix
    fatal: bool = False   # the broker closes the connection after this op (after its error frame, if any)


def error(text, exact=True):
    return Op(b"", ((FRAME_ERROR, text.encode() if isinstance(text, str) else text, exact),), True)


def with_data(op, data):
    return op._replace(data=data)


@pytest.fixture(scope="module")
def broker(module_nsqd_factory):
    return module_nsqd_factory("--log-level=debug")  # the debug line for a fatal error orders one test


@pytest.fixture(scope="module")
def addr(broker):
    return broker.address


@pytest.fixture(scope="module")
def bystanders(addr):
    """A consumer and a producer that stay connected while the module throws bad input at the broker."""
    topic = unique("bystander")
    c = consumer(addr, topic, "ch", rdy=100)
    p = Conn(addr)
    p.publish(topic, b"before")
    assert c.read_message().body == b"before"
    yield Bystanders(topic, c, p)
    c.close()
    p.close()


# ---- strategies ----------------------------------------------------------------------------------------------
bodies = st.binary(min_size=1, max_size=300)
topics = st.sampled_from(TOPICS)
msg_ids = st.integers(0, 2**64 - 1).map(lambda v: b"%016x" % v)
bad_names = st.binary(max_size=30).filter(lambda b: not NAME.match(b) and not set(b) & set(b" \r\n"))

valid_init = st.one_of(
    st.sampled_from([Op(b"NOP\n"), Op(b"NOP\r\n")]),
    st.builds(lambda t, b: Op(C.pub(t, b), (OK,)), topics, bodies),
    st.builds(lambda t, bs: Op(C.mpub(t, bs), (OK,)), topics, st.lists(bodies, min_size=1, max_size=5)),
    st.builds(lambda t, d, b: Op(C.dpub(t, d, b), (OK,)), topics, st.integers(0, 3_600_000), bodies),
    st.builds(lambda f: Op(C.identify(f), (OK,)), st.fixed_dictionaries({}, optional={
        "client_id": st.text(max_size=10), "msg_timeout": st.integers(1000, 900_000),
        "sample_rate": st.integers(0, 99), "heartbeat_interval": st.integers(1000, 60_000),
        "output_buffer_size": st.integers(64, 65536), "user_agent": st.text(max_size=10)})),
)


def _unknown_line(raw):
    line = raw[:-1] if raw.endswith(b"\r") else raw
    token = line.split(b" ")[0]
    return with_data(error(b"E_INVALID invalid command " + token), raw + b"\n")


def _bad_size(verb, size):
    if size <= 0:
        text = f"E_BAD_MESSAGE {verb} invalid message body size {size}"
    else:
        text = f"E_BAD_MESSAGE {verb} message too big {size} > 1048576"
    line = b"PUB t\n" if verb == "PUB" else b"DPUB t 0\n"
    return with_data(error(text), line + struct.pack(">i", size))


def _bad_identify_body(body):
    return with_data(error("E_BAD_BODY IDENTIFY failed to decode JSON body"), C._with_body(b"IDENTIFY\n", body))


sizes = st.one_of(st.integers(-2**31, 0), st.integers(1048577, 2**31 - 1))
any_state_fatal = st.one_of(
    st.binary(max_size=60).filter(lambda b: b"\n" not in b and b.rstrip(b"\r").split(b" ")[0] not in VERBS)
    .map(_unknown_line),
    st.builds(_bad_size, st.sampled_from(["PUB", "DPUB"]), sizes),
    bad_names.map(lambda n: with_data(error("E_BAD_TOPIC PUB topic name ", exact=False), b"PUB " + n + b"\n")),
    st.builds(lambda v: with_data(error(f"E_INVALID DPUB timeout {v} out of range 0-3600000"),
                                  b"DPUB t %d\n" % v), st.integers(3_600_001, 9_000_000_000_000)),
    st.builds(lambda v: with_data(error(f"E_BAD_BODY MPUB invalid message count {v}"),
                                  b"MPUB t\n" + struct.pack(">ii", 100, v)), st.integers(-2**31, 0)),
    st.just(Op(b"PUB " + b"t" * 16400, (), True)),  # longer than nsqd's read buffer: closed, no frame
)
init_fatal = st.one_of(
    any_state_fatal,
    st.sampled_from([(b"RDY 1\n", "RDY"), (b"RDY\n", "RDY"), (b"FIN 0123456789abcdef\n", "FIN"),
                     (b"REQ 0123456789abcdef 0\n", "REQ"), (b"TOUCH 0123456789abcdef\n", "TOUCH"),
                     (b"CLS\n", "CLS")])
    .map(lambda lv: with_data(error(f"E_INVALID cannot {lv[1]} in current state"), lv[0])),
    st.just(with_data(error("E_AUTH_DISABLED AUTH disabled"), C.auth(b"secret"))),
    st.binary(min_size=1, max_size=100)
    .filter(lambda b: not b.strip().startswith(b"{") and b.strip() != b"null").map(_bad_identify_body),
    bad_names.map(lambda n: with_data(error("E_BAD_CHANNEL SUB channel name ", exact=False),
                                      b"SUB t " + n + b"\n")),
)


@st.composite
def init_streams(draw):
    ops = draw(st.lists(valid_init, max_size=8))
    if draw(st.booleans()):
        ops.append(draw(init_fatal))
    return ops


@st.composite
def subscribed_streams(draw):
    ops = [Op(C.sub(SUB_TOPIC, "ch"), (OK,))]
    closing = False
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(["nop", "rdy", "fin", "req", "touch", "pub", "cls"]))
        if kind == "nop":
            ops.append(Op(b"NOP\n"))
        elif kind == "rdy" and closing:  # ignored before its count is even parsed
            ops.append(Op(b"RDY " + draw(st.binary(max_size=9).filter(lambda b: b"\n" not in b)) + b"\n"))
        elif kind == "rdy":
            ops.append(Op(b"RDY %d\n" % draw(st.integers(0, 2500))))
        elif kind in ("fin", "req", "touch"):
            msg_id = draw(msg_ids)
            verb = kind.upper()
            line = {"fin": C.fin, "touch": C.touch}[kind](msg_id) if kind != "req" else \
                C.req(msg_id, draw(st.integers(0, 10**9)))
            ops.append(Op(line, ((FRAME_ERROR, b"E_%s_FAILED %s %s failed ID not in flight" % (
                verb.encode(), verb.encode(), msg_id), True),)))
        elif kind == "pub":
            ops.append(Op(C.pub(draw(topics), draw(bodies)), (OK,)))
        elif closing:
            ops.append(with_data(error("E_INVALID cannot CLS in current state"), b"CLS\n"))
            return ops
        else:
            closing = True
            ops.append(Op(b"CLS\n", ((FRAME_RESPONSE, b"CLOSE_WAIT", True),)))
    if draw(st.booleans()):
        fatal = [
            any_state_fatal,
            st.just(with_data(error("E_INVALID cannot SUB in current state"), C.sub(SUB_TOPIC, "ch"))),
            st.just(with_data(error("E_INVALID cannot IDENTIFY in current state"), C.identify({}))),
            st.binary(max_size=40).filter(lambda b: len(b) != 16 and not set(b) & set(b" \r\n"))
            .map(lambda b: with_data(error("E_INVALID invalid message ID"), b"FIN " + b + b"\n")),
            msg_ids.map(lambda i: with_data(error("E_INVALID REQ could not parse timeout -1"),
                                            b"REQ " + i + b" -1\n")),
        ]
        if not closing:
            fatal.append(st.integers(2501, 2**31).map(
                lambda n: with_data(error(f"E_INVALID RDY count {n} out of range 0-2500"), b"RDY %d\n" % n)))
        ops.append(draw(st.one_of(fatal)))
    return ops


def chunked(data, cuts):
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:])]


def run_stream(addr, bystanders, ops, cuts):
    """Send the ops in random chunks and check the frames against the model."""
    bystanders.keep_alive()
    fatal = bool(ops) and ops[-1].fatal
    if not fatal:
        ops = ops + [Op(C.pub(TOPICS[0], b"sentinel"), (OK,))]
    data = b"".join(op.data for op in ops)
    with Conn(addr) as c:
        for chunk in chunked(data, cuts):
            c.send(chunk)
        for op in ops:
            for frame_type, expected, exact in op.replies:
                got = c.expect_frame()
                assert got[0] == frame_type and (got[1] == expected if exact else got[1].startswith(expected)), \
                    f"after {op.data[:80]!r}: expected {expected!r}, got {got!r}"
        if not fatal:
            c.half_close()
        c.expect_closed()


# ---- the tests --------------------------------------------------------------------------------------------------
@SETTINGS
@given(ops=init_streams(), cuts=st.lists(st.integers(0, 2**20), max_size=8))
def test_model_streams_before_sub(addr, bystanders, ops, cuts):
    run_stream(addr, bystanders, ops, cuts)


@SETTINGS
@given(ops=subscribed_streams(), cuts=st.lists(st.integers(0, 2**20), max_size=8))
def test_model_streams_after_sub(addr, bystanders, ops, cuts):
    run_stream(addr, bystanders, ops, cuts)


TOKENS = [b"PUB t\n", b"MPUB t\n", b"DPUB t 10\n", b"IDENTIFY\n", b"SUB t c\n", b"RDY 5\n", b"NOP\n", b"FIN ",
          b"REQ ", b"TOUCH ", b"CLS\n", b"AUTH\n", b"\n", b" ", b"\r\n", struct.pack(">i", 4),
          struct.pack(">i", 0), struct.pack(">i", -1), struct.pack(">i", 2**31 - 1), b'{"a":1}', b"0123456789abcdef"]
garbage = st.lists(st.one_of(st.sampled_from(TOKENS), st.binary(max_size=40)), max_size=20).map(b"".join)


def check_garbage_reply(frames):
    for i, (frame_type, data) in enumerate(frames):
        assert frame_type in (FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE), frames
        if frame_type == FRAME_ERROR:
            code = data.split(b" ", 1)[0].decode("latin-1")
            assert code in FATAL_CODES | NON_FATAL_CODES, data
            if code in FATAL_CODES:
                assert i == len(frames) - 1, f"frames after a fatal error: {frames}"


@SETTINGS
@given(magic=st.sampled_from([b"  V2", b"", b"  V1", b" V2"]), junk=garbage,
       cuts=st.lists(st.integers(0, 2**20), max_size=8))
def test_garbage_gets_well_formed_frames_and_a_close(addr, bystanders, magic, junk, cuts):
    bystanders.keep_alive()
    data = magic + junk
    with Conn(addr, magic=False) as c:
        c.send_until_reset(chunked(data, cuts))
        c.half_close()
        frames = c.read_until_closed()
    check_garbage_reply(frames)
    if len(data) >= 4 and data[:4] != b"  V2":
        assert frames in ([], [(FRAME_ERROR, b"E_BAD_PROTOCOL")])  # [] if the reset overtook the frame


def test_fatal_error_while_output_is_backed_up(broker, addr, bystanders):
    """A consumer that has megabytes of messages still queued for it in the broker sends an invalid command and
    then more bytes: the error frame follows the queued messages, nothing after the error is executed, and the
    connection is closed without a reset that would throw away what the client has not read yet."""
    topic, other = unique(), unique()
    with Conn(addr) as p:
        for _ in range(6):
            p.send(C.mpub(topic, [b"x" * 1_000_000] * 4))
        for _ in range(6):
            p.expect_response()
    with Conn(addr, rcvbuf=4096) as c, consumer(addr, other, "ch", rdy=1) as watch:
        c.subscribe(topic, "ch", rdy=2500)
        # 3 MB through a tiny window take a while, and meanwhile the broker queues the rest in rounds of 4 MB:
        # far more than the socket buffers hold, so its output is still backed up when BOGUS arrives
        c.read_messages(3)
        mark = len(broker.lines)
        c.send(b"BOGUS\n")
        broker.wait_for_line("fatal error: E_INVALID invalid command BOGUS", start=mark)
        c.send(b"NOP\n", C.pub(other, b"after the error"))
        frames = c.read_until_closed(timeout=30)
        watch.expect_no_frame(0.3)
    assert not c.reset, f"reset after {len(frames)} frames"
    assert frames[-1] == (FRAME_ERROR, b"E_INVALID invalid command BOGUS")
    assert {t for t, _ in frames[:-1]} == {FRAME_MESSAGE}


def test_broker_survived(broker, addr, bystanders):
    topic, c, p = bystanders
    p.publish(topic, b"after")
    assert c.read_message().body == b"after"
    fresh = unique()
    with consumer(addr, fresh, "ch", rdy=1) as r, Conn(addr) as w:
        w.publish(fresh, b"fresh")
        assert r.read_message().body == b"fresh"
    out = broker.output()
    bad = [line for line in out.splitlines() if "died" in line or "Traceback" in line]
    assert not bad, "\n".join(bad)
