"""`V2Parser.lone_pub`, the broker's fast path for a read holding exactly one PUB, against `feed`, the reference:
whenever lone_pub answers, feed would have produced exactly that one Pub and nothing else; it declines everything
else (errors included), and it never changes the parser."""

import struct

from hypothesis import HealthCheck, given, settings, strategies as st

from nsqpy.protocol import Limits, V2Parser
from nsqpy.protocol import client as c
from nsqpy.protocol.commands import Pub

LIMITS = Limits(max_msg_size=64)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

name_bytes = st.one_of(st.text("abcXYZ019._-#", min_size=0, max_size=70).map(str.encode),
                       st.binary(max_size=70).filter(lambda b: b"\n" not in b))
size_field = st.one_of(st.integers(-3, 70), st.integers(-2**31, 2**31 - 1))


@st.composite
def pub_like(draw):
    """PUB lines with valid and invalid names, sizes that lie, extra params, \\r, trailing or missing bytes."""
    topic = draw(name_bytes)
    body = draw(st.binary(max_size=70))
    size = draw(st.one_of(st.just(len(body)), size_field))
    line = b"PUB " + topic + draw(st.sampled_from([b"", b"\r", b" extra"])) + b"\n"
    data = line + struct.pack(">i", size) + body + draw(st.sampled_from([b"", b"NOP\n", b"P"]))
    return data


def fresh():
    p = V2Parser(LIMITS)
    p.feed(b"  V2")
    return p


@SETTINGS
@given(st.one_of(pub_like(), st.builds(c.pub, st.text("abc._-", min_size=1, max_size=64), st.binary(min_size=1, max_size=64)),
                 st.binary(max_size=120)))
def test_lone_pub_agrees_with_feed(data):
    fast = fresh().lone_pub(data)
    reference = fresh().feed(data)
    if fast is not None:
        topic, body = fast
        assert reference == [Pub(topic, body)]


def test_lone_pub_takes_the_plain_round_trip_and_declines_the_rest():
    p = fresh()
    assert p.lone_pub(c.pub("t.1", b"hello")) == ("t.1", b"hello")
    assert p.lone_pub(c.pub("t", b"x") + c.nop()) is None            # more than one command
    assert p.lone_pub(c.pub("t", b"x")[:-1]) is None                 # incomplete
    assert p.lone_pub(c.pub("bad!", b"x")) is None                  # E_BAD_TOPIC is feed's to send
    assert p.lone_pub(c.pub("t", b"x" * 65)) is None                 # E_BAD_MESSAGE too
    assert p.lone_pub(b"PUB t\n\x00\x00\x00\x00") is None             # size 0
    p.feed(b"PUB t\n")                                               # half a command buffered
    assert p.lone_pub(c.pub("t", b"x")) is None
    assert fresh().lone_pub(c.pub("t", b"x")) is not None
    assert V2Parser(LIMITS).lone_pub(c.pub("t", b"x")) is None       # the magic has not been read yet
