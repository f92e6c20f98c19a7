"""gunicorn's asgi worker with a bound on the time a request's headers may take: the worker class of nsqd's HTTP API
by default (``--http-worker-class=asgi``) and of nsqlookupd's.

Why: an asgi worker serves every connection from one event loop, so a client that sends its request slowly holds
a connection, not the worker (Go's net/http, a goroutine per connection, is as unaffected); but gunicorn's asgi
worker bounds neither the first request's headers nor a connection that never sends any, so each slow client
would be kept for as long as it trickles. Here a connection is closed (nothing is answered: no request was read)
when a request's headers are not complete HEADER_TIMEOUT after its first byte, or after the connection was made
for its first request. Between requests gunicorn's keep-alive timeout applies, and once the headers are in, the
body's wait is gunicorn's (its ``timeout``).

How: ``HeaderDeadlineProtocol`` is gunicorn's ``ASGIProtocol`` plus one loop timer. It is armed when the
connection is made and at the first byte received while no request is being answered; it is cancelled when the
application is called, which gunicorn does once a request's headers are parsed. The worker class puts the
protocol in place in the worker process (gunicorn's asgi worker builds ``gunicorn.workers.gasgi.ASGIProtocol``
for each connection), before it serves. ``tests/lookupd/test_lookupd_slow_clients.py`` and
``tests/http/test_nsqd_slow_clients.py`` check the bound against real servers, so a gunicorn that stops building
its connections this way fails a test instead of losing the bound.

Resource handling: the timer belongs to the connection and is cancelled when it is lost.
"""
from __future__ import annotations

import asyncio
import signal

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

__all__ = ["HeaderDeadlineWorker", "HeaderDeadlineProtocol", "HEADER_TIMEOUT"]

HEADER_TIMEOUT = 10.0   # seconds a request's headers may take (a real client sends them in one segment)


class HeaderDeadlineProtocol(ASGIProtocol):
    timeout = HEADER_TIMEOUT

    def __init__(self, worker):
        super().__init__(worker)
        self._deadline = None
        self._answering = 0       # application calls under way on this connection
        app = self.app

        async def app_called(scope, receive, send):
            if scope.get("type") == "http":
                self._cancel_deadline()  # the headers are in
                self._answering += 1
                try:
                    await app(scope, receive, send)
                finally:
                    self._answering -= 1
            else:
                await app(scope, receive, send)
        self.app = app_called

    def connection_made(self, transport):
        super().connection_made(transport)
        self._arm_deadline()

    def data_received(self, data):
        if self._deadline is None and not self._answering:
            self._arm_deadline()   # the first byte of the next request
        super().data_received(data)

    def connection_lost(self, exc):
        self._cancel_deadline()
        super().connection_lost(exc)

    def _arm_deadline(self):
        self._cancel_deadline()
        self._deadline = self.worker.loop.call_later(self.timeout, self._expired)

    def _cancel_deadline(self):
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self):
        self._deadline = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _ignored():
    pass


class HeaderDeadlineWorker(gasgi.ASGIWorker):
    """Also stops at once on SIGTERM: gunicorn's serving loop looks at ``alive`` once a second, so a stop waited up
    to a second for it; the signal now cancels that loop's sleep (the loop turns a cancel into its graceful
    shutdown). Only while the loop runs: before it, a cancel would end the start-up instead."""

    def init_process(self):
        gasgi.ASGIProtocol = HeaderDeadlineProtocol  # this worker process builds its connections with it
        super().init_process()

    def init_signals(self):
        """gunicorn's handlers, but ^C is the daemon's supervisor's to act on (it TERMs its children in order): a
        SIGINT that reaches this worker while it still boots (nsqd says it listens once the arbiter does, before
        its workers have loaded the app) is dropped instead of starting a quick shutdown."""
        super().init_signals()
        self.loop.add_signal_handler(signal.SIGINT, _ignored)

    def _cleanup(self):
        super()._cleanup()  # closing the loop puts Python's KeyboardInterrupt handler back for SIGINT
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def handle_exit_signal(self):
        super().handle_exit_signal()
        self._wake_serving_loop()

    def handle_quit_signal(self):
        super().handle_quit_signal()
        self._wake_serving_loop()

    def _wake_serving_loop(self):
        if not self.servers or len(self.servers) != len(self.sockets):
            return  # still starting (or a listener failed): the loop sees ``alive`` within a second
        for task in asyncio.all_tasks(self.loop):
            if getattr(task.get_coro(), "__name__", "") == "_serve" and not task.cancelling():
                task.cancel()
