"""The limits of spec 1.11 set by flags, seen over TCP: one broker with small limits for the whole module."""
import time

import pytest

from nsqpy.protocol import client as C
from wire import Conn, consumer, holding, producer, unique

FLAGS = ["--max-channel-consumers=1", "--max-msg-size=100", "--max-body-size=1000", "--max-rdy-count=10",
         "--max-req-timeout=5s", "--max-msg-timeout=3s", "--max-heartbeat-interval=5s"]


@pytest.fixture(scope="module")
def addr(module_nsqd_factory):
    return module_nsqd_factory(*FLAGS).address


def test_max_channel_consumers(addr):
    topic = unique()
    with consumer(addr, topic, "ch") as first, Conn(addr) as second:
        second.send(C.sub(topic, "ch"))
        # nsqd's code (not spec 1.4's table, which says E_SUB_FAILED) sends this code and text
        second.expect_fatal("E_TOO_MANY_CHANNEL_CONSUMERS",
                            f"E_TOO_MANY_CHANNEL_CONSUMERS channel consumers for {topic}:ch exceeds limit of 1")
        with consumer(addr, topic, "other"):  # the limit is per channel
            pass
        first.send(C.rdy(1))
        producer(addr, topic, b"still served")
        assert first.read_message().body == b"still served"


def test_max_channel_consumers_frees_a_place_on_disconnect(addr):
    topic = unique()
    consumer(addr, topic, "ch").close()
    # the broker may see the close after the next SUB: retrying is what a client does, and it must succeed
    for _ in range(50):
        with Conn(addr) as c:
            c.send(C.sub(topic, "ch"))
            frame = c.expect_frame()
            if frame == (0, b"OK"):
                return
            assert frame[1].startswith(b"E_TOO_MANY_CHANNEL_CONSUMERS"), frame
            c.expect_closed()
    raise AssertionError("the channel never had room again")


@pytest.mark.parametrize("data, text", [
    (C.pub("t", b"x" * 101), "E_BAD_MESSAGE PUB message too big 101 > 100"),
    (C.dpub("t", 1, b"x" * 101), "E_BAD_MESSAGE DPUB message too big 101 > 100"),
    (C.mpub("t", [b"x" * 101]), "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    (b"MPUB t\n" + (1001).to_bytes(4, "big"), "E_BAD_BODY MPUB body too big 1001 > 1000"),
    (b"MPUB t\n" + (8).to_bytes(4, "big") + (200).to_bytes(4, "big"), "E_BAD_BODY MPUB invalid message count 200"),
    (b"IDENTIFY\n" + (1001).to_bytes(4, "big"), "E_BAD_BODY IDENTIFY body too big 1001 > 1000"),
    (C.dpub("t", 5001, b"x"), "E_INVALID DPUB timeout 5001 out of range 0-5000"),
    (C.identify({"msg_timeout": 3001}), "E_BAD_BODY IDENTIFY msg timeout (3001) is invalid"),
    (C.identify({"heartbeat_interval": 5001}), "E_BAD_BODY IDENTIFY heartbeat interval (5001) is invalid"),
])
def test_limits_from_flags(addr, data, text):
    with Conn(addr) as c:
        c.send(data)
        c.expect_fatal(text.split(" ", 1)[0], text)


def test_at_the_limits_is_fine(addr):
    topic = unique()
    with Conn(addr) as c:
        reply = c.identify(feature_negotiation=True, msg_timeout=3000, heartbeat_interval=5000)
        assert (reply["max_rdy_count"], reply["max_msg_timeout"], reply["msg_timeout"]) == (10, 3000, 3000)
        c.send(C.pub(topic, b"x" * 100), C.dpub(topic, 5000, b"y"), C.mpub(topic, [b"z" * 100] * 9))
        for _ in range(3):
            c.expect_response()
        c.subscribe(topic, "ch", rdy=10)
        assert len(c.read_messages(10)) == 10
        c.send(C.rdy(11))
        c.expect_fatal("E_INVALID", "E_INVALID RDY count 11 out of range 0-10")


def test_touch_cannot_extend_past_max_msg_timeout(addr):
    """msg_timeout 2 s, --max-msg-timeout 3 s: TOUCHes every 0.75 s would keep the message until 2 s after the
    last one (4.25 s or later), but the total is capped at delivery + 3 s, when it times out and comes back."""
    _, c, [m] = holding(addr, b"touched", msg_timeout=2000)
    t0 = time.monotonic()
    with c:
        for _ in range(3):
            c.expect_no_frame(0.75)
            c.send(C.touch(m.id))
        last_touch = time.monotonic() - t0
        again = c.read_message()
        elapsed = time.monotonic() - t0
        assert (again.id, again.attempts) == (m.id, 2)
        # the last TOUCH reached the broker after it was sent: uncapped, the message would stay until 2 s later
        assert 2.9 <= elapsed < last_touch + 2.0, (elapsed, last_touch)


def test_a_full_ephemeral_topic_turns_over_once_drained(nsqd_factory):
    """--mem-queue-size=1 gives an ephemeral topic the smallest log (no disk; a new segment only while fewer than
    one message waits): filling it drops what does not fit
    (NSQ's rule for ephemeral topics), and once the channel drained it, new messages are delivered again."""
    nsqd = nsqd_factory("--mem-queue-size=1")
    topic = unique() + "#ephemeral"
    body = b"e" * 65536
    with consumer(nsqd.address, topic, "ch") as c, Conn(nsqd.address) as p:
        for _ in range(600):  # 39 MB: more than the log holds, every PUB still answered OK
            p.send(C.pub(topic, body))
            p.expect_response(b"OK")
        c.send(C.rdy(100))
        got = 0
        while True:  # drain what was kept, finishing as it comes
            frames = [f for f in c.read_until_settled() if f[0] == 2]
            if not frames:
                break
            for _, data in frames:
                c.send(C.fin(C.decode_message(data).id))
            got += len(frames)
        assert 0 < got < 600
        after = b"after the drain".ljust(len(body), b".")  # as big as the rest: it needs a fresh segment
        p.publish(topic, after)
        assert c.read_message().body == after
