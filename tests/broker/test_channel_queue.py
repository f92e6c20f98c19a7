"""A channel's queue as nsqd keeps it (issue 46, items 1-3; spec 1.10 and 2.3), against a real nsqd.

* ``message_count`` counts every message put into the channel (nsqd's ``Channel.PutMessage`` and
  ``PutMessageDeferred``), whether or not a consumer took it; requeues, timeouts and deferred messages coming due
  are put back with ``put`` and do not count again. The first channel of a topic takes the topic's backlog and
  counts it. The same number in /stats JSON and text, /metrics and statsd.
* A deferred publish (DPUB, HTTP ``/pub?defer=``) is a channel's ``deferred_count`` right after the publish, not
  its depth, and counts in the depth once it came due and waits in the queue.
* A timed-out message and a REQ 0 go behind what waits in the channel (nsqd re-puts them into its queue).
"""
import json
import re
import socket

import pytest

from nsqpy.protocol import client as C
from tests.http.conftest import request
from tests.polling import wait_until
from wire import Conn, consumer, producer, unique, warm_up


@pytest.fixture(scope="module")
def statsd():
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(60)
    yield udp
    udp.close()


@pytest.fixture(scope="module")
def nsqd(module_nsqd_factory, statsd):
    n = module_nsqd_factory(f"--statsd-address=127.0.0.1:{statsd.getsockname()[1]}", "--statsd-interval=1s",
                            "--statsd-prefix=")
    warm_up(n.address)
    return n


def stats(nsqd, topic):
    status, _, body = request(nsqd.http_address, "GET", f"/stats?format=json&topic={topic}")
    assert status == 200, body
    [t] = json.loads(body)["topics"]
    return t


def channels(nsqd, topic):
    return {c["channel_name"]: c for c in stats(nsqd, topic)["channels"]}


def create_channel(nsqd, topic, channel):
    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        status, _, body = request(nsqd.http_address, "POST", path)
        assert status == 200, body


def test_message_count_counts_what_the_channel_was_given_in_every_format(nsqd, statsd):
    topic = unique("mc")
    producer(nsqd.address, topic, b"b1", b"b2", b"b3")  # no channel yet: the first one takes them
    create_channel(nsqd, topic, "idle")
    create_channel(nsqd, topic, "busy")
    with Conn(nsqd.address) as p:
        p.send(C.mpub(topic, [b"m%d" % i for i in range(5)]), C.pub(topic, b"p"))
        p.expect_response()
        p.expect_response()
    with consumer(nsqd.address, topic, "busy", rdy=10) as c:
        a, *rest = c.read_messages(6)
        c.send(C.req(a.id, 0), *[C.fin(m.id) for m in rest])
        again = c.read_message()  # a requeue is put back into the channel: not counted again
        assert again.id == a.id
        c.send(C.fin(again.id))
        c.sync()
        create_channel(nsqd, topic, "late")  # counts only what comes after it
        producer(nsqd.address, topic, b"last")
        # idle: the backlog (3), the MPUB (5), the PUB and the last one; busy: the 6 published after it existed
        want = {"idle": 10, "busy": 7, "late": 1}
        got = wait_until(lambda: (lambda ch: {k: v["message_count"] for k, v in ch.items()} == want and ch)(
            channels(nsqd, topic)), 30, "message counts")
        assert got["idle"]["depth"] == 10 and got["busy"]["requeue_count"] == 1

        status, _, body = request(nsqd.http_address, "GET", f"/stats?topic={topic}")
        lines = body.decode().splitlines()
        for name, n in want.items():
            line = next(x for x in lines if x.strip().startswith(f"[{name} "))
            assert re.search(rf"msgs: {n}\b", line), line

        def metric():
            _, _, text = request(nsqd.http_address, "GET", "/metrics")
            found = {}
            for m in re.finditer(rf'^nsq_channel_messages_total{{channel="(\w+)",topic="{topic}"}} (\S+)$',
                                 text.decode(), re.M):
                found[m.group(1)] = float(m.group(2))
            return found == want and found
        wait_until(metric, 30, "/metrics")

        pushed = {}
        keys = {f"topic.{topic}.channel.{name}.message_count": name for name in want}
        while {keys[k]: v for k, v in pushed.items()} != want:
            data, _ = statsd.recvfrom(65536)  # counters are deltas: their sum is the count
            for line in data.decode().splitlines():
                key, _, value = line.partition(":")
                if key in keys:
                    pushed[key] = pushed.get(key, 0) + int(value.split("|")[0])
            assert all(pushed.get(k, 0) <= want[keys[k]] for k in keys), pushed


def test_deferred_publishes_count_as_deferred_at_once_then_as_depth_when_due(nsqd):
    topic = unique("dq")
    create_channel(nsqd, topic, "a")
    with Conn(nsqd.address) as p:
        p.send(C.dpub(topic, 60_000, b"tcp"))
        p.expect_response()
    status, _, body = request(nsqd.http_address, "POST", f"/pub?topic={topic}&defer=60000", b"http")
    assert (status, body) == (200, b"OK")
    ch = channels(nsqd, topic)["a"]
    assert (ch["depth"], ch["deferred_count"], ch["message_count"]) == (0, 2, 2)

    with Conn(nsqd.address) as p:
        p.send(C.dpub(topic, 1000, b"soon"), C.pub(topic, b"now"))
        p.expect_response()
        p.expect_response()
    ch = channels(nsqd, topic)["a"]
    assert (ch["depth"], ch["deferred_count"]) == (1, 3)
    wait_until(lambda: (lambda c: (c["depth"], c["deferred_count"]) == (2, 2))(channels(nsqd, topic)["a"]), 30,
               "the short deferral came due and waits in the queue")
    with consumer(nsqd.address, topic, "a", rdy=2) as c:
        got = c.read_messages(2)
        assert sorted(m.body for m in got) == [b"now", b"soon"]
        c.send(*[C.fin(m.id) for m in got])
        c.sync()
    ch = channels(nsqd, topic)["a"]
    assert (ch["depth"], ch["deferred_count"], ch["in_flight_count"], ch["message_count"]) == (0, 2, 0, 4)


def _held_first(nsqd, **identify):
    """A topic with "first" and "second" published and a consumer (RDY 1) holding "first"."""
    topic = unique("order")
    producer(nsqd.address, topic, b"first", b"second")
    c = consumer(nsqd.address, topic, "ch", rdy=1, **identify)
    first = c.read_message()
    assert first.body == b"first"
    return c, first


def _second_then_first(c, first):
    """The next message is "second", then "first" again (one more attempt): it went behind."""
    second = c.read_message()
    assert second.body == b"second"
    c.send(C.fin(second.id))
    again = c.read_message()
    assert (again.id, again.body, again.attempts) == (first.id, b"first", 2)
    c.send(C.fin(again.id))
    c.sync()


def test_a_timed_out_message_goes_behind_what_waits_in_the_channel(nsqd):
    c, first = _held_first(nsqd, msg_timeout=1000)
    with c:
        _second_then_first(c, first)  # "first" times out after a second, while "second" waits


def test_a_req_0_goes_behind_what_waits_in_the_channel(nsqd):
    c, first = _held_first(nsqd)
    with c:
        c.send(C.req(first.id, 0))
        _second_then_first(c, first)
