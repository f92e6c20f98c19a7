"""The thread-safe blocking API: `Producer` and `Consumer` run their async counterparts on an event loop in a
background thread of their own, so scripts, Spark executors and threaded services never see asyncio.

Any thread may call a Producer's methods at the same time; they are handed to the loop thread, which owns the
connection, so publishes from many threads are pipelined on one connection. `publish_async` returns a
`concurrent.futures.Future` for callers that want many publishes in flight from one thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import signal
import threading

from nsqpy.client.consumer import AsyncConsumer
from nsqpy.client.errors import StoppedError
from nsqpy.client.producer import AsyncProducer

__all__ = ["Producer", "Consumer", "LoopThread"]


class LoopThread:
    """An event loop running in a daemon thread until `close()`."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro, timeout: float | None = None):
        future = self.submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout}s") from None

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()
            self.loop.close()


def _bytes(body) -> bytes:
    return body.encode() if isinstance(body, str) else bytes(body)


class Producer:
    """Blocking producer. Example::

        with Producer(["127.0.0.1:4150"]) as p:
            p.publish("events", b"hello")
            p.mpub("events", [b"a", b"b"])
            p.dpub("events", 1.5, b"later")    # delivered 1.5 s from now

    `timeout` bounds how long a blocking call waits, fail-over included (None: no bound); each reply must come
    within the `write_timeout` option (1 s), else the publish goes to the next nsqd (see AsyncProducer). Other
    options are `Config` fields, plus `connect_timeout` and `max_body_size`.
    """

    def __init__(self, nsqd_tcp_addresses, *, timeout: float | None = 60.0, **options):
        self._thread = LoopThread("nsq-producer")
        self.timeout = timeout
        self._async = self._thread.run(_build(AsyncProducer, nsqd_tcp_addresses, **options))
        self._stopped = False
        self._closed = False

    def connect(self, timeout: float | None = None) -> None:
        """Dial now instead of on the first publish (raises NoConnection if no nsqd answers within `timeout`,
        default connect_timeout; 0: after one try of each address)."""
        self._run(self._async.connect(timeout))

    def publish(self, topic: str, body) -> None:
        self._run(self._async.publish(topic, _bytes(body)))

    def mpub(self, topic: str, bodies) -> None:
        self._run(self._async.mpub(topic, [_bytes(b) for b in bodies]))

    def dpub(self, topic: str, delay: float, body) -> None:
        self._run(self._async.dpub(topic, delay, _bytes(body)))

    def publish_async(self, topic: str, body) -> concurrent.futures.Future:
        return self._submit(self._async.publish(topic, _bytes(body)))

    def mpub_async(self, topic: str, bodies) -> concurrent.futures.Future:
        return self._submit(self._async.mpub(topic, [_bytes(b) for b in bodies]))

    def _open(self, coro):
        if self._closed:   # the loop is gone: nothing would ever run the coroutine
            coro.close()
            raise StoppedError("producer closed")
        return coro

    def _submit(self, coro) -> concurrent.futures.Future:
        return self._thread.submit(self._open(coro))

    def _run(self, coro):
        return self._thread.run(self._open(coro), self.timeout)

    def stop(self) -> None:
        """Stop publishing: dials and back-off end at once, publishes already sent get their replies, later
        ones raise StoppedError (from any thread). close() then ends the loop thread."""
        if not self._stopped:
            self._stopped = True
            self._thread.run(self._async.close(), 10.0)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.stop()
        finally:
            self._thread.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _build(cls, *args, **kwargs):
    return cls(*args, **kwargs)   # built on the loop thread: asyncio objects bind to the running loop


class Consumer:
    """Blocking consumer; the handler (sync or async) is called for each message. Example::

        def handle(message):
            print(message.body)            # return normally: FIN; raise (or return False): REQ with backoff

        c = Consumer("events", "archive", handle, nsqd_tcp_addresses=["127.0.0.1:4150"], max_in_flight=10)
        c.run()                            # until SIGINT/SIGTERM or c.stop() from another thread
    """

    def __init__(self, topic: str, channel: str, handler, **options):
        self._thread = LoopThread("nsq-consumer")
        self._async: AsyncConsumer = self._thread.run(_build(AsyncConsumer, topic, channel, handler, **options))
        self._stop_requested = threading.Event()
        self._stopped = False

    @property
    def stats(self) -> dict:
        return dict(self._async.stats)

    @property
    def connections(self) -> list:
        return list(self._async.conns.values())

    @property
    def async_consumer(self) -> AsyncConsumer:
        return self._async

    def call(self, fn, *args):
        """Run `fn(*args)` on the consumer's loop thread and return its result (for inspection in tests/tools)."""
        async def _call():
            return fn(*args)
        return self._thread.run(_call(), 30.0)

    def start(self) -> "Consumer":
        self._thread.run(self._async.start())
        return self

    def run(self) -> None:
        """start(), then block until stop() is asked for or SIGINT/SIGTERM arrives (main thread), then stop."""
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda *_: self._stop_requested.set())
        try:
            self.start()
            while not self._stop_requested.wait(0.5):   # wakes for signals; the Event is the real condition
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()

    def request_stop(self) -> None:
        """Make run() return (after a graceful stop); safe from handlers and signal handlers."""
        self._stop_requested.set()

    def set_max_in_flight(self, value: int) -> None:
        self._thread.loop.call_soon_threadsafe(self._async.set_max_in_flight, value)

    def stop(self) -> None:
        """Graceful stop (see AsyncConsumer.stop). A handler must call request_stop() instead: stop() waits for
        the handlers, so calling it from one would wait for itself until drain_timeout."""
        if threading.current_thread().name.startswith("nsq-handler"):
            raise RuntimeError("call request_stop() from a handler, not stop()")
        if self._stopped:
            return
        self._stopped = True
        self._stop_requested.set()
        try:
            self._thread.run(self._async.stop())
        finally:
            self._thread.close()

    def __enter__(self) -> "Consumer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
