"""The producer in a cluster: names checked before sending, a publish timeout that fails over from an nsqd that
stopped answering, and fail-back to the preferred nsqd when it returns, with back-off between probes."""

import os
import signal
import socket
import threading
import time

import pytest

from nsqpy.client import Consumer, InvalidName, Producer
from nsqpy.client.producer import failback_delays
from tests.client.helpers import addr, unique, wait_until


@pytest.mark.parametrize("name", ["bad topic!", "", "x" * 65, "a/b", "t#ephemeralx", "ünï"])
def test_publish_checks_the_topic_name_before_dialling(name):
    # nothing listens on the address: a name that reached the wire would raise NoConnection instead
    p = Producer(["127.0.0.1:1"], connect_timeout=0)
    try:
        for call in (lambda: p.publish(name, b"x"), lambda: p.mpub(name, [b"x"]), lambda: p.dpub(name, 1, b"x")):
            with pytest.raises(InvalidName, match=r"invalid topic name .*\[\.a-zA-Z0-9_-\].*#ephemeral"):
                call()
    finally:
        p.close()


def test_consumer_refuses_a_bad_channel_name_with_the_rule():
    with pytest.raises(InvalidName, match="invalid channel name 'a b'.*1-64 characters"):
        Consumer("good", "a b", lambda m: None, nsqd_tcp_addresses=["127.0.0.1:1"])


def test_failback_delays_double_up_to_the_cap():
    delays = failback_delays(15.0)
    assert [next(delays) for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    small = failback_delays(0.5)
    assert [next(small) for _ in range(3)] == [0.5, 0.5, 0.5]


class Collector:
    """Consumers on several nsqds recording (nsqd address, body) of what each delivers."""

    def __init__(self, topic):
        self.topic = topic
        self.got = []
        self.consumers = {}
        self._lock = threading.Lock()

    def watch(self, node):
        def handle(m):
            with self._lock:
                self.got.append((m.nsqd_address, m.body))
        self.consumers[addr(node)] = Consumer(self.topic, "ch", handle, nsqd_tcp_addresses=[addr(node)]).start()

    def unwatch(self, node):
        self.consumers.pop(addr(node)).stop()

    def bodies_from(self, node):
        with self._lock:
            return [body for address, body in self.got if address == addr(node)]

    def close(self):
        for c in self.consumers.values():
            c.stop()


def test_producer_fails_back_to_the_first_nsqd_when_it_returns(nsqd_factory):
    a, b = nsqd_factory(workers=1, node_id=1), nsqd_factory(workers=1, node_id=2)
    port = a.port
    topic = unique("failback")
    seen = Collector(topic)
    published = []
    p = Producer([addr(a), addr(b)], max_reconnect_interval=1.0)

    def publish():
        body = b"%d" % len(published)
        p.publish(topic, body)
        published.append(body)

    try:
        seen.watch(a)
        seen.watch(b)
        publish()
        wait_until(lambda: seen.bodies_from(a) == [b"0"], what="the first message on the first nsqd")
        seen.unwatch(a)
        assert a.stop() == 0
        for _ in range(5):
            publish()
        wait_until(lambda: len(seen.bodies_from(b)) == 5, what="5 messages on the second nsqd")
        back = nsqd_factory(f"--tcp-address=127.0.0.1:{port}", workers=1, node_id=1)
        assert back.port == port
        seen.watch(back)
        started = time.monotonic()

        def on_first_again():   # publish bursts until they land on the returned nsqd (probes every <= 1 s)
            burst = [b"%d-%d" % (len(published), i) for i in range(50)]
            futures = [p.publish_async(topic, body) for body in burst]   # in flight while the switch happens
            for future in futures:
                future.result(60)
            published.extend(burst)
            return p._async.connection.port == port
        wait_until(on_first_again, what="publishes back on the first nsqd", timeout=60)
        took = time.monotonic() - started
        for _ in range(5):
            publish()
        wait_until(lambda: len(seen.got) >= len(published), what="every publish delivered")
        with Producer([addr(b)]) as sync:    # a sync point: anything still on its way from b comes before it
            sync.publish(topic, b"sync")
        wait_until(lambda: b"sync" in seen.bodies_from(b), what="the sync message")
        assert sorted(body for _, body in seen.got if body != b"sync") == sorted(published)   # none lost or twice
        assert set(published[-5:]) <= set(seen.bodies_from(back))    # after the switch: the first nsqd only
        print(f"fail-back after the first nsqd returned: {took:.2f}s")
    finally:
        p.close()
        seen.close()


def test_publish_fails_over_when_its_nsqd_stops_answering(nsqd_factory):
    a, b = nsqd_factory(workers=1, node_id=1), nsqd_factory(workers=1, node_id=2)
    topic = unique("stalled")
    seen = Collector(topic)
    p = Producer([addr(a), addr(b)])      # write_timeout: go-nsq's 1 s
    try:
        seen.watch(b)
        p.publish(topic, b"before")
        os.killpg(a.proc.pid, signal.SIGSTOP)   # the kernel still accepts TCP for it; nothing answers
        try:
            started = time.monotonic()
            p.publish(topic, b"during")           # waits ~write_timeout on a, then goes to b
            p.publish(topic, b"after")            # b at once (a is probed in the background)
            took = time.monotonic() - started
            wait_until(lambda: seen.bodies_from(b) == [b"during", b"after"], what="both on the second nsqd")
        finally:
            os.killpg(a.proc.pid, signal.SIGCONT)
        assert took < 30, took                  # it used to wait for read_timeout (60 s), then raise
        print(f"publish while the first nsqd was stopped: {took:.2f}s")
    finally:
        p.close()
        seen.close()


def test_failback_probes_back_off_against_a_dead_first_node(shared_nsqd):
    """A first 'nsqd' that accepts and closes at once: probes must come at 1, 2, 4... s (capped), not in a loop."""
    dead = socket.create_server(("127.0.0.1", 0))
    accepts = []
    stop = threading.Event()

    def serve():
        dead.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = dead.accept()
            except OSError:
                continue
            accepts.append(time.monotonic())
            conn.close()
    server = threading.Thread(target=serve)
    server.start()
    p = Producer(["127.0.0.1:%d" % dead.getsockname()[1], addr(shared_nsqd)], max_reconnect_interval=4.0)
    try:
        topic = unique("probes")
        p.publish(topic, b"x")               # the first address fails: fail-over, then probes start
        wait_until(lambda: len(accepts) >= 4, what="4 dials of the dead node", timeout=90)
        p.publish(topic, b"y")               # a sync point: the producer still publishes on the second
        gaps = [later - earlier for earlier, later in zip(accepts[1:], accepts[2:])]
        # the first dial is the fail-over; then the probes' waits grow 1, 2, 4 s (a loaded machine only
        # stretches them)
        assert gaps[0] >= 1.5 and gaps[1] >= 3.0, gaps
    finally:
        p.close()
        stop.set()
        server.join()
        dead.close()
