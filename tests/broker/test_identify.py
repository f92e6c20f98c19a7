"""IDENTIFY (spec 1.6, 1.7) and heartbeats (spec 1.9) over real sockets."""
import json
import time

import pytest

from nsqpy.protocol import client as C
from wire import Conn, consumer, unique


@pytest.fixture(scope="module")
def addr(shared_nsqd):
    return shared_nsqd.address


def test_plain_ok_without_feature_negotiation(addr):
    with Conn(addr) as c:
        assert c.identify(client_id="c", hostname="h", user_agent="nsqpy-tests/1.0") == b"OK"
        assert c.identify(short_id="go-nsq", long_id="go-nsq.long", unknown={"x": 1}) == b"OK"  # unknown keys
        c.publish(unique(), b"after identify")


def test_feature_negotiation_reply(addr):
    with Conn(addr) as c:
        # no certificate: tls_v1 is refused; deflate_level is 6 unless deflate is granted
        reply = c.identify(feature_negotiation=True, tls_v1=True, deflate_level=3,
                           msg_timeout=5000, sample_rate=10, output_buffer_size=512, output_buffer_timeout=100)
        assert reply == {
            "max_rdy_count": 2500, "version": "1.3.0", "max_msg_timeout": 900000, "msg_timeout": 5000,
            "tls_v1": False, "deflate": False, "deflate_level": 6, "max_deflate_level": 6, "snappy": False,
            "sample_rate": 10, "auth_required": False, "output_buffer_size": 512, "output_buffer_timeout": 100,
        }
        # nothing was granted, so no upgrade and no extra OK frame: the next frame answers the next command
        c.send(C.pub(unique(), b"x"))
        c.expect_response(b"OK")


def test_feature_negotiation_defaults(addr):
    with Conn(addr) as c:
        reply = c.identify(feature_negotiation=True)
        assert (reply["msg_timeout"], reply["output_buffer_size"], reply["output_buffer_timeout"],
                reply["sample_rate"], reply["auth_required"], reply["version"]) == (60000, 16384, 250, 0, False,
                                                                                    "1.3.0")


BAD = [
    ({"heartbeat_interval": 999}, "E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid"),
    ({"heartbeat_interval": 60001}, "E_BAD_BODY IDENTIFY heartbeat interval (60001) is invalid"),
    ({"heartbeat_interval": -2}, "E_BAD_BODY IDENTIFY heartbeat interval (-2) is invalid"),
    ({"output_buffer_size": 63}, "E_BAD_BODY IDENTIFY output buffer size (63) is invalid"),
    ({"output_buffer_size": 65537}, "E_BAD_BODY IDENTIFY output buffer size (65537) is invalid"),
    ({"output_buffer_timeout": 1}, "E_BAD_BODY IDENTIFY output buffer timeout (1) is invalid"),
    ({"sample_rate": 100}, "E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    ({"sample_rate": -1}, "E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
    ({"msg_timeout": 999}, "E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    ({"msg_timeout": 900001}, "E_BAD_BODY IDENTIFY msg timeout (900001) is invalid"),
    ({"heartbeat_interval": "1000"}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ({"feature_negotiation": 1}, "E_BAD_BODY IDENTIFY failed to decode JSON body"),
    ([1, 2], "E_BAD_BODY IDENTIFY failed to decode JSON body"),
]


@pytest.mark.parametrize("fields, text", BAD, ids=[t[28:] for _, t in BAD])
def test_invalid_fields_are_fatal_bad_body(addr, fields, text):
    with Conn(addr) as c:
        c.send(C._with_body(b"IDENTIFY\n", json.dumps(fields).encode()))
        c.expect_fatal("E_BAD_BODY", text)


def test_heartbeats_disabled_refuses_sub_but_allows_pub(addr):
    with Conn(addr) as c:
        assert c.identify(heartbeat_interval=-1) == b"OK"
        c.publish(unique(), b"producer without heartbeats")
        c.send(C.sub(unique(), "ch"))
        c.expect_fatal("E_INVALID", "E_INVALID cannot SUB with heartbeats disabled")


def test_heartbeats_and_read_deadline(addr):
    """heartbeat_interval 1000: every client gets `_heartbeat_` each second; one that answers with NOP stays,
    producers and consumers that send nothing are dropped after two intervals, with no error frame."""
    idle_producer = Conn(addr)
    idle_producer.identify(heartbeat_interval=1000)
    t0 = time.monotonic()
    idle_consumer = consumer(addr, unique(), "ch", heartbeat_interval=1000)
    with Conn(addr) as alive:
        alive.identify(heartbeat_interval=1000)
        alive.subscribe(unique(), "ch", rdy=1)
        for _ in range(4):  # four intervals: twice the read deadline
            assert alive.next_frame(heartbeats=True) == (0, b"_heartbeat_")  # or closed, if it came too late
            alive.send(C.nop())
        alive.send(C.pub(unique(), b"x"))
        alive.expect_response(b"OK")
    for idle in (idle_producer, idle_consumer):
        frames = idle.read_until_closed()
        assert frames and set(frames) == {(0, b"_heartbeat_")}, frames
        assert 1 <= len(frames) <= 2, frames  # dropped after 2 intervals without reads
        idle.close()
    assert time.monotonic() - t0 >= 1.9



def test_read_deadline_is_two_intervals_after_the_last_read(addr):
    """The deadline counts from the last read, not from a heartbeat tick: with 2 s heartbeats, a NOP 0.6 s after a
    heartbeat moves it to 4 s after the NOP, and the connection is dropped then: not 4 s after the heartbeat
    (3.4 s after the NOP), nor at the heartbeat tick 1.4 s later (5.4 s after it)."""
    with Conn(addr) as c:
        c.identify(heartbeat_interval=2000)
        assert c.next_frame(heartbeats=True) == (0, b"_heartbeat_")
        c.expect_no_frame(0.6)
        c.send(C.nop())
        t0 = time.monotonic()  # the NOP is the last thing the broker reads
        frames = c.read_until_closed(timeout=10)
        elapsed = time.monotonic() - t0
    assert set(frames) == {(0, b"_heartbeat_")} and 1 <= len(frames) <= 2, frames
    assert 3.9 <= elapsed <= 4.9, elapsed  # 3.4 counted from the heartbeat, 5.4 at the tick
