"""Producer and Consumer against one real nsqpy nsqd (shared by the module; every test has its own topic)."""

import asyncio
import threading
import time

import pytest

from nsqpy.client import AsyncConsumer, AsyncProducer, Consumer, InvalidName, Producer, ProtocolError
from nsqpy.protocol.errors import BadMessage
from tests.client.helpers import addr, unique, wait_until


@pytest.fixture
def producer(shared_nsqd):
    with Producer([addr(shared_nsqd)]) as p:
        yield p


def consume(nsqd, topic, handler, channel="ch", **options):
    options.setdefault("max_in_flight", 100)
    return Consumer(topic, channel, handler, nsqd_tcp_addresses=[addr(nsqd)], **options).start()


def test_publish_mpub_dpub_round_trip(shared_nsqd, producer):
    topic = unique("rt")
    got = []
    c = consume(shared_nsqd, topic, lambda m: got.append(m.body))
    try:
        producer.publish(topic, b"single")
        producer.publish(topic, "text is utf-8")
        producer.mpub(topic, [b"m%03d" % i for i in range(300)])
        wait_until(lambda: len(got) == 302, what="302 messages")
        assert sorted(got) == sorted([b"single", b"text is utf-8"] + [b"m%03d" % i for i in range(300)])
        assert c.stats["finished"] == 302
    finally:
        c.stop()


def test_mpub_larger_than_the_body_limit_is_split_and_pipelined(shared_nsqd):
    topic = unique("big")
    got = []
    c = consume(shared_nsqd, topic, lambda m: got.append(len(m.body)), max_in_flight=200)
    try:
        with Producer([addr(shared_nsqd)], max_body_size=64 * 1024) as p:
            p.mpub(topic, [b"x" * 1000] * 500)   # ~500 KB: eight MPUBs in flight at once
        wait_until(lambda: len(got) == 500, what="500 messages")
    finally:
        c.stop()


def test_dpub_is_not_delivered_before_its_delay(shared_nsqd, producer):
    topic = unique("dpub")
    got = []
    c = consume(shared_nsqd, topic, lambda m: got.append(time.monotonic()))
    try:
        sent = time.monotonic()
        producer.dpub(topic, 1.0, b"later")
        wait_until(lambda: got, what="the deferred message")
        assert got[0] - sent >= 0.9     # lower bound only: a loaded machine may deliver it late
    finally:
        c.stop()


def test_errors_carry_nsqs_code(shared_nsqd, producer):
    with pytest.raises(InvalidName):       # a bad name never reaches nsqd: the client checks it first
        producer.publish("bad!", b"x")
    with pytest.raises(BadMessage) as info:  # above nsqd's default --max-msg-size (1 MiB)
        producer.publish(unique("big"), b"x" * ((1 << 20) + 1))
    assert info.value.code == "E_BAD_MESSAGE" and info.value.fatal
    assert isinstance(info.value, ProtocolError)
    topic = unique("after")
    got = []
    c = consume(shared_nsqd, topic, lambda m: got.append(m.body))
    try:
        producer.publish(topic, b"the next publish reconnects")
        wait_until(lambda: got == [b"the next publish reconnects"], what="the message after the error")
    finally:
        c.stop()


def test_many_publishes_pipelined_from_many_threads(shared_nsqd, producer):
    topic = unique("pipe")
    got = []
    c = consume(shared_nsqd, topic, lambda m: got.append(m.body), max_in_flight=500)
    try:
        futures = [producer.publish_async(topic, b"%d" % i) for i in range(1000)]
        for f in futures:
            assert f.result(30) is None

        def publish_some(k):
            for i in range(100):
                producer.publish(topic, b"t%d-%d" % (k, i))
        threads = [threading.Thread(target=publish_some, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_until(lambda: len(got) == 1400, what="1400 messages")
        assert len(set(got)) == 1400
    finally:
        c.stop()


def test_handler_failure_requeues_with_delay_and_backs_off(shared_nsqd, producer):
    topic = unique("req")
    attempts = []
    levels = []
    holder = {}

    def handle(m):
        attempts.append((m.body, m.attempts, time.monotonic()))
        levels.append(holder["c"].async_consumer.backoff.level)
        if m.attempts == 1:
            raise RuntimeError("first try fails")
    c = holder["c"] = consume(shared_nsqd, topic, handle, default_requeue_delay=0.3, backoff_multiplier=0.05,
                              max_backoff_duration=0.5)
    try:
        producer.publish(topic, b"a")
        wait_until(lambda: len(attempts) == 2, what="a redelivery")
        (_, a1, t1), (_, a2, t2) = attempts
        assert (a1, a2) == (1, 2)
        assert t2 - t1 >= 0.25           # REQ delay = default_requeue_delay x attempts (0.3 s)
        assert levels[1] >= 1            # the failure put the consumer into backoff
        wait_until(lambda: c.call(lambda: c.async_consumer.backoff.level) == 0, what="backoff recovered")
        wait_until(lambda: c.call(lambda: sum(x.rdy for x in c.connections)) == 100, what="RDY restored")
        assert c.stats["requeued"] == 1 and c.stats["finished"] == 1
    finally:
        c.stop()


def test_max_attempts_gives_up_and_fins(shared_nsqd, producer):
    topic = unique("giveup")
    calls = []
    given_up = []

    def handle(m):
        calls.append(m.attempts)
        m.req(0, backoff=False)
    c = consume(shared_nsqd, topic, handle, max_attempts=3, giving_up=lambda m: given_up.append(m.attempts))
    try:
        producer.publish(topic, b"poison")
        wait_until(lambda: given_up, what="giving up")
        assert calls == [1, 2, 3] and given_up == [4]
        assert c.stats["given_up"] == 1
    finally:
        c.stop()


def test_manual_fin_touch_and_graceful_stop_drains(shared_nsqd, producer):
    topic = unique("manual")
    held = []
    c = consume(shared_nsqd, topic, lambda m: (m.disable_auto_response(), held.append(m)), msg_timeout=2.0)
    producer.mpub(topic, [b"1", b"2", b"3"])
    wait_until(lambda: len(held) == 3, what="3 messages held")
    held[0].touch()
    stopper = threading.Thread(target=c.stop)
    stopper.start()                  # stop() waits for the held messages to be answered
    wait_until(lambda: all(x.closing for x in c.connections), what="CLS sent")
    assert stopper.is_alive()
    for m in held:
        m.fin()
    stopper.join(30)
    assert not stopper.is_alive()
    assert c.stats["finished"] == 3 and c.stats["errors"] == 0


def test_async_api_with_async_handler_and_concurrency(shared_nsqd):
    topic = unique("async")

    async def main():
        running = 0
        peak = 0
        done = []

        async def handle(m):
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)    # the handler's own work
            running -= 1
            done.append(m.body)
        consumer = AsyncConsumer(topic, "ch", handle, nsqd_tcp_addresses=[addr(shared_nsqd)], concurrency=4,
                                 max_in_flight=20)
        await consumer.start()
        producer = AsyncProducer([addr(shared_nsqd)])
        await asyncio.gather(*(producer.publish(topic, b"%d" % i) for i in range(40)))
        await producer.close()
        deadline = time.monotonic() + 30
        while len(done) < 40 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await consumer.stop()
        return done, peak
    done, peak = asyncio.run(main())
    assert len(done) == 40
    assert 1 < peak <= 4


def test_touch_keeps_a_message_past_its_msg_timeout(shared_nsqd, producer):
    topic = unique("touch")
    seen = []
    c = consume(shared_nsqd, topic, lambda m: (m.disable_auto_response(), seen.append(m)), msg_timeout=1.0)
    try:
        producer.publish(topic, b"slow")
        wait_until(lambda: seen, what="the message")
        m = seen[0]
        deadline = time.monotonic() + 2.5          # 2.5 x msg_timeout, touching every 0.3 s
        while time.monotonic() < deadline:
            m.touch()
            time.sleep(0.3)                        # the pace of the handler's work, not synchronisation
        m.fin()
        # A FIN that came too late would be E_FIN_FAILED (counted in errors) and the message redelivered.
        marker = unique("marker").encode()
        producer.publish(topic, marker)            # ordered after the FIN on the consumer's connection
        wait_until(lambda: len(seen) >= 2, what="the marker")
        seen[-1].fin()
        assert [x.body for x in seen] == [b"slow", marker] and c.stats["errors"] == 0
    finally:
        c.stop()
