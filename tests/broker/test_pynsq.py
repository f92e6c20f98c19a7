"""The real pynsq client (0.9.1, on tornado 6.0.4) against a real nsqd: Writer (PUB, MPUB), Readers sharing a
channel and reading several, RDY, backoff and recovery, REQ, max_tries, asynchronous FIN/REQ and a pipelining
consumer, the way an NSQ user's consumers would run them.

Each test owns a fresh asyncio loop wrapped by tornado's IOLoop (pynsq binds ``IOLoop.current()`` when a client is
built). ``PynsqLoop.run_until`` runs the loop until a condition holds or a deadline passes; readers and writers are
closed and the loop is closed at teardown, so no callback of one test runs in another. There is no lookupd here:
every client is given the broker's address directly.

pynsq's units: ``msg_timeout`` and ``requeue_delay`` are seconds (it sends ms), ``Message.requeue(delay=s)`` or
``requeue(time_ms=ms)``, ``Writer.dpub(topic, delay_ms, body)``. pynsq gives up on a message when
``attempts > max_tries``: the handler sees attempts 1..max_tries, ``giving_up`` sees max_tries + 1.

FIN, REQ, TOUCH and RDY get no reply, so "nsqd accepted every one of them" is checked with ``PynsqLoop.barrier``:
a FIN for an ID never delivered must come back as E_FIN_FAILED, and nsqd answers a connection's commands in order,
so any error frame for an earlier command would have arrived first.

All tests share one broker (``shared_nsqd``) and keep to their own topic names.
"""
from __future__ import annotations

import asyncio
import time

import nsq
import pytest
from tornado.ioloop import IOLoop, PeriodicCallback

RUN_DEADLINE = 20.0
POLL_MS = 5


def error_code(error):
    """The leading code of an error frame (pynsq wraps the frame's bytes in ``nsq.Error``)."""
    [data] = error.args
    return data.split(b" ", 1)[0]


class Reader(nsq.Reader):
    """An ``nsq.Reader`` that also records what the test checks: the RDY values it sent, the error frames it got,
    the ``OK`` to its SUB (so a test can publish only once the channel exists) and the messages it gave up on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rdy_sent: list[int] = []
        self.errors: list[nsq.Error] = []
        self.sub_reply = None
        self.given_up: list[nsq.Message] = []

    def _on_connection_ready(self, conn, **kwargs):
        conn.on("response", self._on_sub_response)
        super()._on_connection_ready(conn, **kwargs)

    def _on_sub_response(self, conn, data, **kwargs):
        conn.off("response", self._on_sub_response)
        self.sub_reply = data

    def _send_rdy(self, conn, value):
        before = conn.last_rdy
        super()._send_rdy(conn, value)
        if conn.last_rdy != before:
            self.rdy_sent.append(conn.last_rdy)

    def _on_connection_error(self, conn, error, **kwargs):
        self.errors.append(error)
        super()._on_connection_error(conn, error, **kwargs)

    def giving_up(self, message):
        self.given_up.append(message)


class PynsqLoop:
    def __init__(self, address):
        self.address = f"{address[0]}:{address[1]}"
        self.asyncio_loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.asyncio_loop)
        self.io_loop = IOLoop.current()
        self.readers: list[Reader] = []
        self.writers: list[nsq.Writer] = []
        self.replies: list = []

    def reader(self, topic, channel, handler, **kwargs) -> Reader:
        r = Reader(topic=topic, channel=channel, message_handler=handler, nsqd_tcp_addresses=[self.address],
                   **kwargs)
        self.readers.append(r)
        return r

    def barrier(self, reader):
        """Wait until nsqd processed every command the reader's connection sent so far; returns the error frames
        that came before the barrier's own E_FIN_FAILED."""
        [conn] = reader.conns.values()
        before = len(reader.errors)
        conn.send(nsq.finish(b"0" * 16))
        self.run_until(lambda: len(reader.errors) > before, what="E_FIN_FAILED for an ID never delivered")
        *earlier, last = reader.errors
        assert error_code(last) == b"E_FIN_FAILED", last
        del reader.errors[-1]
        return earlier

    def subscribed(self, *readers):
        """Wait until every reader's SUB was answered, so the channel exists before anything is published."""
        self.run_until(lambda: all(r.sub_reply is not None for r in readers), what="SUB answered")
        assert [r.sub_reply for r in readers] == [b"OK"] * len(readers)

    def writer(self) -> nsq.Writer:
        w = nsq.Writer([self.address])
        self.writers.append(w)
        self.run_until(lambda: any(c.connected() for c in w.conns.values()), what="writer connected")
        return w

    def publish(self, writer, method, *args):
        """Publish with a callback that collects the reply; ``published()`` waits for all of them."""
        getattr(writer, method)(*args, callback=lambda conn, data: self.replies.append(data))

    def published(self, n):
        self.run_until(lambda: len(self.replies) >= n, what=f"{n} publish replies")
        assert self.replies == [b"OK"] * n

    def run_until(self, cond, timeout=RUN_DEADLINE, what="condition"):
        if cond():
            return
        check = PeriodicCallback(lambda: cond() and self.io_loop.stop(), POLL_MS)
        check.start()
        deadline = self.io_loop.call_later(timeout, self.io_loop.stop)
        try:
            self.io_loop.start()
        finally:
            check.stop()
            self.io_loop.remove_timeout(deadline)
        assert cond(), f"{what} did not hold within {timeout} s"

    def close(self):
        for r in self.readers:
            if r.redist_periodic is not None:  # else the loop never ran the reader's start-up
                r.close()
        for w in self.writers:
            for conn in list(w.conns.values()):
                conn.close()
        # Let the close callbacks run once, then drop the loop with everything pynsq scheduled on it.
        self.io_loop.add_callback(self.io_loop.stop)
        self.io_loop.start()
        self.io_loop.close(all_fds=True)
        asyncio.set_event_loop(None)


@pytest.fixture
def loop(shared_nsqd):
    lp = PynsqLoop(shared_nsqd.address)
    yield lp
    lp.close()


def test_writer_and_readers_multicast_across_channels_and_split_within_one(loop):
    n = 300
    bodies = [b"msg-%04d" % i for i in range(n)]
    got = {"a1": [], "a2": [], "b": []}
    ids = {"A": {}, "B": {}}

    def handler(name):
        def handle(message):
            got[name].append(message.body)
            ids[name[0].upper()][message.body] = (message.id, message.attempts)
            return True
        return handle

    readers = [loop.reader("seed", "A", handler("a1")), loop.reader("seed", "A", handler("a2")),
               loop.reader("seed", "B", handler("b"))]
    loop.subscribed(*readers)
    w = loop.writer()
    i = 0
    sends = 0
    while i < n:  # alternate PUB and MPUBs of growing size, in order
        k = sends % 7
        if k == 0:
            loop.publish(w, "pub", "seed", bodies[i])
            i += 1
        else:
            loop.publish(w, "mpub", "seed", bodies[i:i + k * 5])
            i += k * 5
        sends += 1
    loop.published(sends)
    loop.run_until(lambda: len(got["a1"]) + len(got["a2"]) >= n and len(got["b"]) >= n, what="all delivered")
    assert sorted(got["b"]) == bodies
    assert sorted(got["a1"] + got["a2"]) == bodies
    assert got["a1"] and got["a2"], (len(got["a1"]), len(got["a2"]))
    assert ids["A"] == ids["B"]                    # one message ID per message, whichever channel delivers it
    assert {attempts for _, attempts in ids["A"].values()} == {1}
    for r in readers:
        assert loop.barrier(r) == []


def test_handler_false_requeues_and_the_reader_backs_off_then_recovers(loop):
    seen: dict[bytes, list[int]] = {}
    intervals = []

    def handle(message):
        seen.setdefault(message.body, []).append(message.attempts)
        intervals.append(r.backoff_timer.get_interval())
        return not (message.body.startswith(b"fail") and message.attempts == 1)

    def backoff_over():
        return (r.backoff_block_completed and not r.backoff_block and r.backoff_timer.get_interval() == 0
                and r.rdy_sent[-1] == 5)

    # requeue_delay=0: pynsq sends REQ <id> 0 (back on the channel at once); every failure adds
    # 0.028 * max_backoff_duration s of backoff and every success takes it away again.
    r = loop.reader("req", "c", handle, max_in_flight=5, requeue_delay=0, max_backoff_duration=1.0)
    loop.subscribed(r)
    w = loop.writer()
    # One failure with nothing else in flight, so pynsq's backoff runs its whole course: RDY 0 (sent before the
    # REQ), after the backoff interval RDY 1 to test the water, the redelivery succeeds, back to RDY 5.
    loop.publish(w, "pub", "req", b"fail-first")
    loop.published(1)
    loop.run_until(lambda: seen.get(b"fail-first") == [1, 2] and backoff_over(), what="first backoff over")
    assert r.rdy_sent == [1, 5, 0, 1, 5]
    assert intervals[1] > 0                        # the redelivery was handled while backing off
    # Then a stream with a failure in every fifth message: everything is finished and the reader recovers.
    bodies = [b"%s-%02d" % (b"fail" if i % 5 == 0 else b"ok", i) for i in range(30)]
    loop.publish(w, "mpub", "req", bodies)
    loop.published(2)
    expected = {b: [1, 2] if b.startswith(b"fail") else [1] for b in [b"fail-first"] + bodies}
    loop.run_until(lambda: seen == expected and backoff_over(), what="all finished, backoff over")
    assert loop.barrier(r) == []
    assert seen == expected
    assert r.rdy_sent.count(0) >= 2


def test_max_tries_gives_up_after_that_many_attempts(loop):
    attempts = []
    good = []

    def handle(message):
        if message.body == b"poison":
            attempts.append(message.attempts)
            return False
        good.append(message.body)
        return True

    r = loop.reader("poison", "c", handle, max_tries=3, requeue_delay=0, max_backoff_duration=0.5)
    loop.subscribed(r)
    w = loop.writer()
    loop.publish(w, "pub", "poison", b"poison")
    loop.publish(w, "mpub", "poison", [b"good-1", b"good-2"])
    loop.published(2)
    loop.run_until(lambda: r.given_up and len(good) == 2, what="given up")
    assert loop.barrier(r) == []                   # the FIN pynsq sent for the given-up message was accepted
    assert attempts == [1, 2, 3]
    [gone] = r.given_up
    assert (gone.body, gone.attempts, gone.has_responded()) == (b"poison", 4, True)
    loop.publish(w, "pub", "poison", b"after")
    loop.published(3)
    loop.run_until(lambda: good[-1:] == [b"after"], what="message after giving up")
    assert attempts == [1, 2, 3] and good == [b"good-1", b"good-2", b"after"]


def test_async_finish_and_requeue_from_later_callbacks(loop):
    deliveries: dict[bytes, list[int]] = {}

    def handle(message):
        deliveries.setdefault(message.body, []).append(message.attempts)
        message.enable_async()  # answered from a later callback, as a consumer doing I/O would
        if message.body == b"requeue-later" and message.attempts == 1:
            loop.io_loop.call_later(0.05, lambda: message.requeue(delay=0, backoff=False))
        else:
            loop.io_loop.call_later(0.05, message.finish)

    r = loop.reader("async", "c", handle, max_in_flight=4)
    loop.subscribed(r)
    w = loop.writer()
    loop.publish(w, "mpub", "async", [b"finish-later-1", b"finish-later-2", b"requeue-later"])
    loop.published(1)
    expected = {b"finish-later-1": [1], b"finish-later-2": [1], b"requeue-later": [1, 2]}
    loop.run_until(lambda: deliveries == expected and next(iter(r.conns.values())).in_flight == 0,
                   what="async answers")
    assert loop.barrier(r) == []
    assert deliveries == expected
    assert r.rdy_sent == [1, 4]                    # requeue(backoff=False) never backs off


def test_max_in_flight_100_takes_2000_messages_without_loss(loop):
    n, mif, batch = 2000, 100, 50
    bodies = [b"bulk-%05d" % i for i in range(n)]
    got = []
    buf = []
    peak = [0]
    flush_timer = [None]

    def flush():
        flush_timer[0] = None
        while buf:
            buf.pop().finish()

    def handle(message):
        # A batching consumer: finish 50 at a time, or whatever is buffered once the stream pauses for 20 ms.
        message.enable_async()
        got.append((message.body, message.attempts))
        buf.append(message)
        peak[0] = max(peak[0], sum(c.in_flight for c in r.conns.values()))
        if flush_timer[0] is not None:
            loop.io_loop.remove_timeout(flush_timer[0])
            flush_timer[0] = None
        if len(buf) >= batch:
            flush()
        else:
            flush_timer[0] = loop.io_loop.call_later(0.02, flush)

    r = loop.reader("bulk", "c", handle, max_in_flight=mif)
    loop.subscribed(r)
    w = loop.writer()
    for i in range(0, n, 100):
        loop.publish(w, "mpub", "bulk", bodies[i:i + 100])
    loop.published(n // 100)
    loop.run_until(lambda: len(got) >= n and not buf, what=f"{n} messages")
    assert loop.barrier(r) == []
    assert sorted(b for b, _ in got) == bodies
    assert {a for _, a in got} == {1}
    # Pipelined (50 held at once), and never more in flight than RDY: the client's count never exceeds nsqd's.
    assert batch <= peak[0] <= mif, peak[0]
    assert r.rdy_sent == [1, mif]
