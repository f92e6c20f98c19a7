"""Properties: chunking never changes the meaning, garbage only ever gives commands or ProtocolError with a
bounded buffer, and the client and server roles round-trip."""

import struct

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from codec_helpers import normalize, parse_chunks
from nsqpy.protocol import Limits, V2Parser
from nsqpy.protocol import client as c
from nsqpy.protocol.client import FrameDecoder, decode_message, decode_message_batch
from nsqpy.protocol.commands import Cls, Dpub, Fin, Identify, Nop, Pub, Rdy, Req, Sub, Touch, Auth
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.frames import (
    FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, encode_frame, frame_message_batch, message_frame,
    message_frame_size)
from nsqpy.protocol.ids import id_to_hex
from nsqpy.protocol.states import STATE_SUBSCRIBED

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text("abcXYZ019._-", min_size=1, max_size=12)
bodies = st.binary(min_size=1, max_size=40)
ids = st.binary(min_size=16, max_size=16).filter(lambda b: b" " not in b and b"\n" not in b and not b.endswith(b"\r"))
hex_ids = st.integers(0, 2**64 - 1).map(id_to_hex)

publisher_cmd = st.one_of(
    st.builds(lambda t, b: (c.pub(t, b), [Pub(t, b)]), names, bodies),
    st.builds(lambda t, bs: (c.mpub(t, bs), [("mpub", t, bs)]), names, st.lists(bodies, min_size=1, max_size=8)),
    st.builds(lambda t, d, b: (c.dpub(t, d, b), [Dpub(t, d, b)]), names, st.integers(0, 3_600_000), bodies),
    st.just((c.nop(), [Nop()])),
)
consumer_cmd = st.one_of(
    publisher_cmd,
    st.builds(lambda n: (c.rdy(n), [Rdy(n)]), st.integers(0, 2500)),
    st.builds(lambda i: (c.fin(i), [Fin(i)]), st.one_of(ids, hex_ids)),
    st.builds(lambda xs: (b"".join(map(c.fin, xs)), [Fin(x) for x in xs]), st.lists(hex_ids, min_size=2,
                                                                                    max_size=30)),
    st.builds(lambda i, t: (c.req(i, t), [Req(i, min(t, 3_600_000))]), hex_ids, st.integers(0, 10**7)),
    st.builds(lambda i: (c.touch(i), [Touch(i)]), ids),
)


def expand(expected):
    out = []
    for item in expected:
        if isinstance(item, tuple):
            _, topic, bs = item
            out.append(("mpub", topic, list(bs)))
        else:
            out.append(item)
    return out


def comparable(items):
    return [("mpub", x.topic, list(x.bodies())) if type(x).__name__ == "Mpub" else x for x in normalize(items)]


def cut(data, cuts):
    points = sorted({p % (len(data) + 1) for p in cuts})
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)])]


@FAST
@given(st.lists(consumer_cmd, max_size=25), st.lists(st.integers(0, 10**6), max_size=30))
def test_chunking_never_changes_the_commands_consumer(cmds, cuts):
    data = b"  V2" + c.identify({"client_id": "x"}) + c.sub("t", "ch") + b"".join(e for e, _ in cmds)
    expected = [Identify(b'{"client_id":"x"}'), Sub("t", "ch")] + normalize(
        [x for _, exp in cmds for x in expand(exp)])
    whole = comparable(parse_chunks([data], expect_magic=True))
    assert whole == normalize(expected)
    assert comparable(parse_chunks(cut(data, cuts), expect_magic=True)) == whole


@FAST
@given(st.lists(publisher_cmd, max_size=20), st.lists(st.integers(0, 10**6), max_size=30))
def test_chunking_never_changes_the_commands_publisher(cmds, cuts):
    data = c.auth(b"s") + b"".join(e for e, _ in cmds)
    whole = comparable(parse_chunks([data]))
    assert whole == [Auth(b"s")] + [x for _, exp in cmds for x in expand(exp)]
    assert comparable(parse_chunks(cut(data, cuts))) == whole


LIMITS = Limits(max_msg_size=64, max_body_size=256)
prefixes = st.sampled_from([b"", b"PUB t\n", b"MPUB t\n", b"DPUB t 5\n", b"IDENTIFY\n", b"AUTH\n", b"FIN ",
                            b"RDY ", b"SUB t c\n", b"REQ "])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(prefixes, st.binary(max_size=80)), max_size=12), st.sampled_from([0, 3, 4]),
       st.booleans())
def test_garbage_gives_commands_or_protocol_error_and_a_bounded_buffer(pieces, state, magic):
    parser = V2Parser(LIMITS, expect_magic=magic, state=state)
    for prefix, junk in pieces:
        out = parser.feed(prefix + junk)
        # 16 KiB line bound, or a body bounded by max_body_size (+ the 8 bytes of MPUB size and count)
        assert parser.buffered <= max(16384, LIMITS.max_body_size + 8)
        for item in out[:-1]:
            assert not isinstance(item, ProtocolError)
        if out and isinstance(out[-1], ProtocolError):
            assert out[-1].fatal
            return


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.sampled_from([0, 3, 4]))
def test_random_bytes_in_one_feed(data, state):
    out = V2Parser(LIMITS, expect_magic=False, state=state).feed(data)
    assert all(not isinstance(x, ProtocolError) for x in out[:-1])


def test_body_buffering_stays_within_the_declared_size():
    parser = V2Parser(LIMITS, expect_magic=False)
    assert parser.feed(b"PUB t\n" + struct.pack(">i", 64) + b"x" * 63) == []
    assert parser.buffered == 63  # the size field is consumed; only the partial body stays


messages = st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 65535), st.integers(0, 2**64 - 1),
                     st.binary(max_size=50))


@FAST
@given(st.lists(messages, max_size=40), st.lists(st.integers(0, 10**5), max_size=10))
def test_server_frames_round_trip_through_the_client_decoder(msgs, cuts):
    stream = encode_frame(FRAME_RESPONSE, b"OK") + b"".join(
        message_frame(ts, att, id_to_hex(i), body) for ts, att, i, body in msgs) + encode_frame(FRAME_ERROR, b"E_X y")
    decoder = FrameDecoder()
    frames = []
    for chunk in cut(stream, cuts):
        frames += decoder.feed(chunk)
    assert frames[0] == (FRAME_RESPONSE, b"OK") and frames[-1] == (FRAME_ERROR, b"E_X y")
    decoded = [decode_message(p) for t, p in frames[1:-1]]
    assert all(t == FRAME_MESSAGE for t, _ in frames[1:-1])
    assert [(m.timestamp, m.attempts, m.id, m.body) for m in decoded] == [
        (ts, att, id_to_hex(i), body) for ts, att, i, body in msgs]


@FAST
@given(st.lists(messages, min_size=1, max_size=60))
def test_batch_framing_matches_single_framing_and_batch_decoding(msgs):
    src = b"".join(body for *_, body in msgs)
    lengths = np.array([len(body) for *_, body in msgs], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    ts = np.array([m[0] for m in msgs], dtype=np.int64)
    att = np.array([m[1] for m in msgs], dtype=np.uint16)
    mids = np.array([m[2] for m in msgs], dtype=np.uint64)
    total = sum(message_frame_size(len(b)) for *_, b in msgs)
    out = np.zeros(total + 5, dtype=np.uint8)
    assert frame_message_batch(out[:total - 1], 0, ts, att, mids, np.frombuffer(src, np.uint8), offsets,
                               lengths) == -1
    written = frame_message_batch(out, 5, ts, att, mids, np.frombuffer(src, np.uint8), offsets, lengths)
    expected = b"".join(message_frame(t, a, id_to_hex(i), b) for t, a, i, b in msgs)
    assert written == total and out[5:].tobytes() == expected
    batch = decode_message_batch(expected + encode_frame(FRAME_RESPONSE, b"_heartbeat_"))
    assert len(batch) == len(msgs) and batch.consumed == total
    assert [batch.message(k) for k in range(len(msgs))] == [
        decode_message(message_frame(t, a, id_to_hex(i), b)[8:]) for t, a, i, b in msgs]
    assert batch.id_values.tolist() == mids.tolist()


@FAST
@given(st.lists(st.tuples(st.sampled_from(["pub", "mpub", "dpub"]), names, st.lists(bodies, min_size=1,
                                                                                   max_size=5))))
def test_client_encoders_round_trip_through_the_server_parser(cmds):
    data = b""
    expected = []
    for verb, topic, bs in cmds:
        if verb == "pub":
            data += c.pub(topic, bs[0])
            expected.append(Pub(topic, bs[0]))
        elif verb == "dpub":
            data += c.dpub(topic, len(bs), bs[0])
            expected.append(Dpub(topic, len(bs), bs[0]))
        else:
            data += c.mpub(topic, bs)
            expected.append(("mpub", topic, bs))
    assert comparable(parse_chunks([data])) == expected


def test_consumer_session_round_trip():
    data = c.magic() + c.identify({"heartbeat_interval": 1000}) + c.sub("t", "c") + c.rdy(10) + \
        c.touch(b"0" * 16) + c.req(b"1" * 16, 5) + c.cls() + c.fin(b"2" * 16) + c.nop()
    assert parse_chunks([data], expect_magic=True) == [
        Identify(b'{"heartbeat_interval":1000}'), Sub("t", "c"), Rdy(10), Touch(b"0" * 16), Req(b"1" * 16, 5),
        Cls(), Fin(b"2" * 16), Nop()]
    assert STATE_SUBSCRIBED == 3
